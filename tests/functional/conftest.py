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

"""Hooks and fixtures of the functional suite; testbed guest only.

Outside the guest every test here is SKIPPED with the reason below (never
reported as passed): run the suite with ``tools/testbed/run --layout
separate`` (or ``tox -e functional-separate``), which boots the guests
and runs pytest in node B's.

The fixtures are the harness's (:mod:`tests.harness.pytest_fixtures`:
``topo``, ``cleanup``, ``node_a``, ``make_lv``, ``iscsi_source``,
``clone_parts``, the automatic leak check ``no_leaks``, the session's
``stack`` and ``cloud``, and its ``cluster`` of the driver's two volume
services, both over the session's ``control_plane``).  Here:

* ``--tier``: ``ci`` (what CI runs: ``tox -e functional-separate``),
  ``extended`` (the tests marked ``extended``: ``tox -e
  functional-separate-extended``, run by hand, last results in
  doc/source/contributor/testing.rst) or ``all`` (the default, so that
  naming one test always runs it);
* ``@pytest.mark.layouts('one-kernel', 'separate')``: the testbed layouts
  a test is written for (unmarked: one-kernel); the others deselect it.
  Every module here is marked ``separate``: each node its own kernel.
  (The one-kernel layout is left to the load test and the benchmarks,
  which say why.)
"""

from tests.harness.pytest_fixtures import _testbed_logging  # noqa: F401
from tests.harness.pytest_fixtures import cleanup  # noqa: F401
from tests.harness.pytest_fixtures import clone_parts  # noqa: F401
from tests.harness.pytest_fixtures import cloud  # noqa: F401
from tests.harness.pytest_fixtures import cluster  # noqa: F401
from tests.harness.pytest_fixtures import cluster_running  # noqa: F401
from tests.harness.pytest_fixtures import control_plane  # noqa: F401
from tests.harness.pytest_fixtures import dm  # noqa: F401
from tests.harness.pytest_fixtures import iscsi_source  # noqa: F401
from tests.harness.pytest_fixtures import make_lv  # noqa: F401
from tests.harness.pytest_fixtures import no_leaks  # noqa: F401
from tests.harness.pytest_fixtures import node_a  # noqa: F401
from tests.harness.pytest_fixtures import nodes_answer  # noqa: F401
from tests.harness.pytest_fixtures import privileged  # noqa: F401
from tests.harness.pytest_fixtures import services_running  # noqa: F401
from tests.harness.pytest_fixtures import stack  # noqa: F401
from tests.harness.pytest_fixtures import topo  # noqa: F401
from tests.harness import selection
from tests.harness import testbed

NOT_IN_TESTBED = (
    'NOT RUN: functional tests need the cinder-dmclone testbed guest '
    '(%s is missing, so this is not it); run them with tools/testbed/run '
    '--layout separate or tox -e functional-separate'
    % testbed.TOPOLOGY_PATH)


def pytest_addoption(parser):
    parser.addoption(
        '--tier', choices=('ci', 'extended', 'all'), default='all',
        help='ci: the tests CI runs; extended: the ones marked extended '
             '(not in CI for time); all (default): both')


def pytest_configure(config):
    config.addinivalue_line(
        'markers', 'extended: a functional test outside the CI tier '
        '(tox -e functional-separate-extended); it mostly repeats, '
        'through another door, a path the CI tier takes')
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
