#    Licensed under the Apache License, Version 2.0 (the "License"); you may
#    not use this file except in compliance with the License. You may obtain
#    a copy of the License at
#
#         http://www.apache.org/licenses/LICENSE-2.0
#
#    Unless required by applicable law or agreed to in writing, software
#    distributed under the License is distributed on an "AS IS" BASIS, WITHOUT
#    WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied. See the
#    License for the specific language governing permissions and limitations
#    under the License.

"""Fixtures of the functional suite; it runs only inside the testbed guest.

Outside the guest every test here is SKIPPED with the reason below (never
reported as passed): run the suite with ``tools/testbed/run`` (or
``tox -e functional``), which boots the guest and runs pytest in it.

Fixtures:

* ``topo``: the testbed topology (:func:`testbed.topology`);
* ``cleanup``: register undo callables (``cleanup(fn, *args)``); they run
  in reverse order after the test, all of them even when one fails;
* ``node_a``: a :class:`workers.NodeProcess` worker on node A for this test;
* ``make_lv``: ``make_lv(vg, size_bytes, name=None)`` creates an LV that
  is removed after the test;
* ``iscsi_source``: ``iscsi_source(size, seed=1)`` makes an LV on node A
  filled with ``testbed.pattern(seed, size)``, exports it with LIO and logs
  node B in: returns an :class:`IscsiSource` (undone after the test);
* ``clone_parts``: ``clone_parts(size)`` makes a destination LV on node B's
  VG and a zeroed metadata LV on its metadata VG: ``(dest, meta)``;
* ``--tier``: ``ci`` (what CI runs: ``tox -e functional``), ``extended``
  (the tests marked ``extended``: ``tox -e functional-extended``, run by
  hand, last results in doc/source/contributor/testing.rst) or ``all``
  (the default, so that naming one test always runs it);
* ``no_leaks`` (automatic): after every test, fails it if anything is left
  behind (see :func:`testbed.leaks`) and then cleans up by force so the
  next test starts clean (on every node's kernel);
* ``@pytest.mark.layouts('one-kernel', 'separate')``: the testbed layouts
  a test is written for (unmarked: one-kernel); the others deselect it.
"""

import dataclasses
import itertools
import logging
import os

import pytest

from tests.harness import api
from tests.harness import selection
from tests.harness import services
from tests.harness import testbed
from tests.harness import workers

NOT_IN_TESTBED = (
    'NOT RUN: functional tests need the cinder-dmclone testbed guest '
    '(%s is missing, so this is not it); run them with tools/testbed/run '
    'or tox -e functional' % testbed.TOPOLOGY_PATH)


def pytest_addoption(parser):
    parser.addoption(
        '--tier', choices=('ci', 'extended', 'all'), default='all',
        help='ci: the tests CI runs; extended: the ones marked extended '
             '(not in CI for time); all (default): both')


def pytest_configure(config):
    config.addinivalue_line(
        'markers', 'extended: a functional test outside the CI tier '
        '(tox -e functional-extended); it mostly repeats, through another '
        'door, a path the CI tier takes')
    config.addinivalue_line('markers', selection.LAYOUT_MARKER)


def pytest_collection_modifyitems(config, items):
    selection.select_tier(config, items)
    selection.select_layout(config, items)
    selection.skip_outside_testbed(items, 'tests/functional/', NOT_IN_TESTBED)


def pytest_terminal_summary(terminalreporter):
    """Per-phase timings: each module's time (setup, tests, teardown).

    A module's first setup includes what its module-scoped fixtures start
    (the full stack: about two minutes under emulation).
    """
    phases = selection.module_timings(terminalreporter.stats)
    if not phases:
        return
    terminalreporter.section('time per module')
    for module, (seconds, tests) in phases:
        terminalreporter.write_line('%8.1f s  %3d test(s)  %s'
                                    % (seconds, tests, module))


def pytest_report_header(config):
    if testbed.in_testbed():
        return 'testbed: %s' % testbed.TOPOLOGY_PATH
    return '!!! ' + NOT_IN_TESTBED


@pytest.fixture(scope='session', autouse=True)
def _testbed_logging():
    logging.getLogger('testbed').setLevel(logging.DEBUG)


@pytest.fixture(scope='session')
def topo():
    return testbed.topology()


class Cleanup(object):
    def __init__(self):
        self._undo = []

    def __call__(self, fn, *args, **kwargs):
        self._undo.append((fn, args, kwargs))

    def run(self):
        errors = []
        while self._undo:
            fn, args, kwargs = self._undo.pop()
            try:
                fn(*args, **kwargs)
            except Exception as exc:
                testbed.LOG.exception('cleanup %s failed', fn)
                errors.append(exc)
        if errors:
            raise errors[0]


@pytest.fixture
def cleanup():
    c = Cleanup()
    yield c
    c.run()


@pytest.fixture(scope='session')
def stack():
    """The full stack, one per session (test_fullstack.py has its own).

    The separate-kernel scenarios of several modules share it: each
    module starting its own cost two minutes of CI.
    """
    yield from services.running()


@pytest.fixture(scope='session')
def cloud(stack):
    yield from api.opened(stack)


@pytest.fixture(autouse=True)
def services_running(request):
    """Before and after a test of the stack: nodes up, services running."""
    if 'stack' not in request.fixturenames:
        yield
        return
    s = request.getfixturevalue('stack')
    c = request.getfixturevalue('cloud')
    services.keep_running(s, c)
    yield
    services.keep_running(s, c)


@pytest.fixture(autouse=True)
def nodes_answer():
    """Separate kernels: a node a failed test left powered off boots first.

    (Otherwise every later test fails at its leak check's first look at
    that node.)
    """
    if testbed.in_testbed() and testbed.topology().separate \
            and not testbed.answers('a'):
        testbed.LOG.warning('node A is down before the test: booting it')
        testbed.boot('a')
    yield


@pytest.fixture(autouse=True)
def no_leaks(nodes_answer, request):
    if not testbed.in_testbed():
        yield
        return
    baseline = testbed.snapshot()
    yield
    problems = testbed.leaks(baseline)
    if problems:
        testbed.force_cleanup(baseline)
        pytest.fail('test left resources behind (now force-cleaned):\n  '
                    + '\n  '.join(problems), pytrace=False)


@pytest.fixture
def node_a():
    with workers.NodeProcess('a') as worker:
        yield worker


_lv_numbers = itertools.count(1)


@pytest.fixture
def make_lv(cleanup, request):
    def make(vg, size_bytes, name=None):
        # lower case, digits and '-' only: the name may become part of an
        # IQN (iscsi_source), and IQNs allow no '_'
        name = name or 'ft%d-%s' % (next(_lv_numbers),
                                    request.node.name[:40].lower())
        name = ''.join(c if c.isalnum() or c == '-' else '-' for c in name)
        path = testbed.create_lv(vg, name, size_bytes)
        cleanup(testbed.remove_lv, vg, name)
        return path
    return make


@dataclasses.dataclass(frozen=True)
class IscsiSource:
    lv: str                        # the LV on node A
    data: bytes                    # its content
    export: testbed.IscsiExport
    disk: str                      # node B's SCSI disk of the export


@pytest.fixture
def iscsi_source(topo, make_lv, cleanup):
    def make(size, seed=1):
        lv = make_lv(topo.a.vg, size)
        data = testbed.pattern(seed, size)
        testbed.write_direct(lv, 0, data)
        export = testbed.export_iscsi(lv, os.path.basename(lv))
        cleanup(testbed.unexport_iscsi, export)
        disk = testbed.iscsi_login(export)
        cleanup(testbed.iscsi_logout, export)
        return IscsiSource(lv, data, export, disk)
    return make


@pytest.fixture
def clone_parts(topo, make_lv):
    def make(size, meta_size=4 * testbed.MiB):
        dest = make_lv(topo.b.vg, size)
        meta = make_lv(topo.b.meta_vg, meta_size)
        testbed.zero_device(meta, meta_size)
        return dest, meta
    return make
