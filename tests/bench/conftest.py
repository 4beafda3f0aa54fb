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

"""Fixtures of the benchmarks; they run only inside the testbed guest.

Outside the guest every benchmark is SKIPPED (never reported as passed):
run them with ``tox -e bench`` (or ``tools/testbed/run -- tests/bench``).

``--bench-scale quick`` (smaller volumes, fewer points, shorter fio runs)
is for developing the benchmarks; the figures in doc/ come from ``full``.
``@pytest.mark.layouts('one-kernel', 'separate')``: the testbed layouts a
benchmark is written for (unmarked: one-kernel); the others deselect it.
The driver's two volume services are the harness's ``cluster``
(test_move.py); the full stack, ``stack`` and ``cloud``, serves the thin
backend's moves (test_thin_move.py, separate kernels only).
"""

import os

import pytest

from tests.bench import bench
from tests.harness import pytest_fixtures
from tests.harness.pytest_fixtures import cloud  # noqa: F401
from tests.harness.pytest_fixtures import cluster  # noqa: F401
from tests.harness.pytest_fixtures import cluster_running  # noqa: F401
from tests.harness.pytest_fixtures import control_plane  # noqa: F401
from tests.harness.pytest_fixtures import nodes_answer  # noqa: F401
from tests.harness.pytest_fixtures import services_running  # noqa: F401
from tests.harness.pytest_fixtures import stack  # noqa: F401
from tests.harness import selection
from tests.harness import testbed

NOT_IN_TESTBED = (
    'NOT RUN: benchmarks need the cinder-dmclone testbed guest (%s is '
    'missing, so this is not it); run them with tox -e bench'
    % testbed.TOPOLOGY_PATH)

topo = pytest_fixtures.topo


def pytest_addoption(parser):
    parser.addoption('--bench-scale', choices=('quick', 'full'),
                     default='full', help='benchmark size (default: full)')


def pytest_configure(config):
    config.addinivalue_line('markers', selection.LAYOUT_MARKER)


def pytest_collection_modifyitems(config, items):
    selection.select_layout(config, items)
    selection.skip_outside_testbed(items, 'tests/bench/', NOT_IN_TESTBED)


@pytest.fixture(scope='session')
def scale(request):
    return request.config.getoption('--bench-scale')


@pytest.fixture(scope='session')
def results(scale):
    path = os.path.join(testbed.topology().artifacts_dir, 'bench',
                        'results.json')
    return bench.Results(path, scale)


@pytest.fixture(scope='session')
def dm():
    return bench.dm()


@pytest.fixture(scope='session')
def size(scale):
    """Volume size of the data-path benchmarks."""
    return 256 * bench.MiB if scale == 'full' else 64 * bench.MiB


@pytest.fixture(scope='session')
def source_size(scale):
    """Size of the iSCSI source, and of the hydration benchmarks' volumes."""
    return 1024 * bench.MiB if scale == 'full' else 256 * bench.MiB


@pytest.fixture
def lvs():
    made = bench.Lvs()
    yield made
    made.remove_all()


@pytest.fixture(autouse=True)
def clean_slate():
    """Whatever a benchmark leaves behind is removed before the next one."""
    if not testbed.in_testbed():
        yield
        return
    lvs_before = testbed.list_lvs()
    yield
    # (not testbed.leaks(): the module's iSCSI source stays up on purpose)
    for _ in range(3):
        ours = [n for n, u in testbed.dm_devices().items()
                if u.startswith('BENCH-')]
        if not ours:
            break
        testbed.LOG.warning('benchmark left %s; removing', ours)
        for chunk in range(0, len(ours), 200):
            testbed.run(['dmsetup', 'remove', '--force']
                        + ours[chunk:chunk + 200], check=False)
    for lv in sorted(testbed.list_lvs() - lvs_before):
        testbed.LOG.warning('benchmark left LV %s; removing', lv)
        testbed.lvm('lvremove', '-q', '-f', lv, check=False)


@pytest.fixture(scope='module')
def source(topo, source_size):
    """A filled LV on node A, exported over iSCSI, node B logged in.

    Yields (node A's LV path, node B's SCSI disk).  Module scope: every
    measurement of a module reads the same source over the same path
    (clones shorter than the source use its first bytes).
    """
    name = 'bnsrc'
    lv = testbed.create_lv(topo.a.vg, name, source_size)
    export = None
    try:
        bench.fill(lv, source_size)
        export = testbed.export_iscsi(lv, name)
        disk = testbed.iscsi_login(export)
        yield lv, disk
    finally:
        if export is not None:
            testbed.iscsi_logout(export)
            testbed.unexport_iscsi(export)
        testbed.remove_lv(topo.a.vg, name)
