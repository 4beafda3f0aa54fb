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

"""The pytest fixtures of the suites that run in the testbed guest.

A suite's conftest.py (or a test module) imports the ones it uses by
name, ``from tests.harness.pytest_fixtures import topo  # noqa: F401``,
so that each suite states which it shares:

* ``topo``: the testbed topology (:func:`testbed.topology`);
* ``cleanup``: register undo callables (``cleanup(fn, *args)``); they run
  in reverse order after the test, all of them even when one fails;
* ``node_a``: a :class:`workers.NodeProcess` worker on node A for this
  test;
* ``make_lv``: ``make_lv(vg, size_bytes, name=None)`` creates an LV that
  is removed after the test, on the kernel that holds ``vg``
  (:func:`testbed.kernel_of`);
* ``iscsi_source``: ``iscsi_source(size, seed=1)`` makes an LV on node A
  filled with ``testbed.pattern(seed, size)``, exports it with LIO (on
  node A's kernel) and logs node B in: returns an :class:`IscsiSource`
  (undone after the test);
* ``clone_parts``: ``clone_parts(size)`` makes a destination LV on node B's
  VG and a zeroed metadata LV on its metadata VG: ``(dest, meta)``;
* ``no_leaks`` (automatic, with ``nodes_answer``): after every test, fails
  it if anything is left behind (see :func:`testbed.leaks`) and then
  cleans up by force so the next test starts clean (on every node's
  kernel);
* ``control_plane``: the session's MariaDB, RabbitMQ and etcd (a
  :class:`services.Stack` whose parts start when first needed), shared
  by ``stack`` and ``cluster``;
* ``stack`` and ``cloud``: the full Cinder stack (:mod:`services`) and its
  API (:mod:`api`), one per session; ``module_stack`` and
  ``module_cloud`` are the same fixtures (named ``stack`` and ``cloud``)
  for a module that needs a stack of its own; ``services_running``
  (automatic) keeps the nodes up and their services running around a
  test that uses the stack;
* ``cluster``: both nodes' volume services of :mod:`driver_cluster`, for
  the session (:func:`running_cluster` for a suite's own variant);
  ``cluster_running`` (automatic) makes sure they run, and only they,
  at the start of each test that uses it.

One suite a session: each suite's conftest.py has its own session
fixtures, and two suites' clusters would meet on the same nodes.
"""

import dataclasses
import itertools
import logging
import os

import pytest

from tests.harness import api
from tests.harness import driver_cluster
from tests.harness import services
from tests.harness import testbed
from tests.harness import volume_node
from tests.harness import workers


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


# -- the device-mapper layer on this kernel ---------------------------------

@pytest.fixture
def privileged():
    """cinder_dmclone.privileged, run as a volume service runs it.

    cinder's utils.execute reads CONF.rootwrap_config (when no root
    helper is given): cinder's global options are registered first, as a
    cinder service does.
    """
    from cinder.common import config  # noqa: F401
    from cinder_dmclone import privileged
    return privileged


@pytest.fixture
def dm(privileged, cleanup):
    """The real DMSetup; devices it creates are removed after the test."""
    wrapper = privileged.DMSetup()

    class Tracking(object):
        def __getattr__(self, name):
            return getattr(wrapper, name)

        def create(self, name, segments, uuid=None):
            wrapper.create(name, segments, uuid or 'dmclone-ft-' + name)
            cleanup(wrapper.remove, name)

    return Tracking()


# -- the full stack ----------------------------------------------------------

@pytest.fixture(scope='session')
def control_plane():
    """The session's :class:`services.Stack`, started piecemeal.

    One MariaDB and one etcd per testbed: the full stack (:func:`stack`)
    and, on separate kernels, the driver cluster (:func:`cluster`) share
    them, in whichever order a session's modules come.  Whoever comes
    first starts what it needs (:meth:`services.Stack.
    start_control_plane`); the other finds it running; everything stops
    when the session ends.
    """
    if not testbed.in_testbed():
        pytest.skip('needs the testbed guest')
    s = services.Stack(testbed.topology())
    yield s
    services.finish(s)


@pytest.fixture(scope='session')
def stack(control_plane):
    """The full stack, one per session.

    The separate-kernel scenarios of several modules share it
    (test_fullstack.py, test_moves.py, test_source_lost.py,
    test_control_plane.py): each module starting its own cost two
    minutes of CI.
    """
    yield from services.running(control_plane)


@pytest.fixture(scope='session')
def cloud(stack):
    yield from api.opened(stack)


@pytest.fixture(scope='module', name='stack')
def module_stack():
    """The full stack, for the importing module only (one-kernel layout).

    For the load test (tests/faults/test_load.py), which runs on the
    one-kernel layout alone: there the next modules' harnesses use the
    same volume groups and must not meet the stack's services.  On
    separate kernels the modules share one (:func:`stack`); this one's
    MariaDB would meet the session's :func:`control_plane`.
    """
    yield from services.running()


@pytest.fixture(scope='module', name='cloud')
def module_cloud(stack):
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


# -- the driver's two volume services -----------------------------------------

def running_cluster(control_plane):
    """Start both nodes' services over a fresh database; yield, stop.

    One kernel: the database is a SQLite file, the locks files, both
    on the one file system.  Separate kernels: database ``cinder_ft`` on
    the control plane's MariaDB and its etcd, started here unless the
    session's full stack runs already (see :func:`control_plane`).
    """
    if not testbed.in_testbed():
        pytest.skip('needs the testbed guest')
    if testbed.topology().separate:
        control_plane.start_control_plane(volume_node.CONTROL_PLANE)
        control_plane.create_database(volume_node.FT_DATABASE, fresh=True)
    # (A start recovers what it finds on the node: not beside others.)
    control_plane.stop_volumes()
    driver_cluster.setup_database()
    c = driver_cluster.Cluster(control_plane)
    try:
        c.start('a')
        c.start('b')
        yield c
    finally:
        c.close()


@pytest.fixture(scope='session')
def cluster(control_plane):
    """Both nodes' volume services over one database, for the session.

    A suite's conftest.py imports it (with ``control_plane``), never a
    test module: a fixture imported into two modules is two fixtures,
    and two clusters would meet on the same volume groups and ports.
    """
    yield from running_cluster(control_plane)


@pytest.fixture(autouse=True)
def cluster_running(nodes_answer, request):
    """Before a test of the cluster: its services run, and only theirs.

    (:meth:`driver_cluster.Cluster.ensure_running`: a worker a test
    killed is started again, the full stack's volume services stopped.)
    """
    if 'cluster' in request.fixturenames:
        request.getfixturevalue('cluster').ensure_running()
    yield


# -- every test: nodes up, nothing left behind -------------------------------

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


# -- kernel objects for one test ---------------------------------------------

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
        node = testbed.kernel_of(vg)
        path = testbed.create_lv(vg, name, size_bytes, node=node)
        cleanup(testbed.remove_lv, vg, name, node=node)
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
    # Node A's side (its LV's data, its LIO export) runs on node A's
    # kernel: here in the one-kernel layout, in a worker on node A on
    # separate kernels, which ends after the undo steps below.
    on_nodes = workers.NodeCalls()
    cleanup(on_nodes.close)

    def make(size, seed=1):
        lv = make_lv(topo.a.vg, size)
        data = testbed.pattern(seed, size)
        on_nodes.call('a', testbed.write_pattern_digest, lv, seed, size)
        export = on_nodes.call('a', testbed.export_iscsi, lv,
                               os.path.basename(lv))
        cleanup(on_nodes.call, 'a', testbed.unexport_iscsi, export)
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
