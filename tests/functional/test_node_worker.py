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

"""The node-A worker pattern: code runs as node A, os-brick as node B.

Later tests instantiate the Cinder driver for node A inside a
:class:`NodeProcess` and attach its exports from the pytest process with
os-brick; this proves the pieces: the worker really runs on node A with
configfs visible, results, state and exceptions cross back, and an LIO
export created by rtslib-fb inside the worker is reachable from node B's
os-brick iSCSI connector.

Separate kernels: "on node A" is node A's own kernel (its boot id and
host name, not this process's), where node A's LV is made and read; the
pytest process is node B.  (In the one-kernel layout the worker was in
network namespace ``nodeA`` of the one kernel.)
"""

import os

import pytest

from cinder_dmclone import privileged
from tests.harness import testbed
from tests.harness.testbed import MiB
from tests.harness import workers

pytestmark = pytest.mark.layouts('separate')


def _whoami():
    with open('/proc/sys/kernel/random/boot_id') as f:
        boot_id = f.read().strip()
    return {'process': (boot_id, os.getpid()), 'kernel': boot_id,
            'hostname': os.uname().nodename,
            'configfs': os.path.isdir(testbed.LIO_ROOT + '/core')}


def _fail(message):
    raise ValueError(message)


def test_worker_runs_in_node_a(topo, node_a):
    me = _whoami()
    there = node_a.call(_whoami)
    # another process (a pid alone could repeat in another kernel)
    assert there['process'] != me['process']
    # on node A's kernel, not this one (node B's)
    assert (there['hostname'], me['hostname']) == (topo.a.hostname,
                                                   topo.b.hostname)
    assert there['kernel'] != me['kernel']
    assert there['configfs'], 'configfs not visible in node A'
    addresses = node_a.run(['ip', '-o', '-4', 'addr', 'show']).stdout
    assert topo.a.ip + '/' in addresses
    assert topo.b.ip + '/' not in addresses


def test_worker_state_and_errors(node_a):
    node_a.call(workers.remember, 'answer', {'x': 42})
    assert node_a.call(workers.recall, 'answer') == {'x': 42}
    with pytest.raises(ValueError, match='from node A') as info:
        node_a.call(_fail, 'from node A')
    assert any('raised on node-a' in note for note in info.value.__notes__)
    with pytest.raises(testbed.CommandError):
        node_a.run(['false'])
    # the worker survives its callables' exceptions
    assert node_a.call(workers.recall, 'answer') == {'x': 42}


# Extended since 2026-11-26: CI's machine ran the CI tier at half the
# speed it was sized on (doc/source/contributor/testing.rst).
@pytest.mark.extended
def test_rtslib_export_on_node_a_os_brick_attach_on_node_b(
        topo, node_a, cleanup):
    size = 16 * MiB
    lv = testbed.create_lv(topo.a.vg, 'worker-vol', size, node='a')
    cleanup(testbed.remove_lv, topo.a.vg, 'worker-vol', node='a')
    data = testbed.pattern(11, size)
    node_a.call(testbed.write_direct, lv, 0, data)

    export = node_a.call(testbed.export_iscsi_rtslib, lv, 'worker-vol')
    # fallback: targetcli, on node A's kernel (whose LIO it is)
    cleanup(node_a.call, testbed.unexport_iscsi, export)
    assert export.portal == topo.a.portal
    tpg = testbed.lio_tpg_path(export.target_iqn)
    assert node_a.call(os.path.isdir, tpg + '/np/' + export.portal)
    # What a move reads before it goes (Source._admits_only): the export
    # admits node B's initiator alone, seen from node A's service.
    assert node_a.call(privileged.lio_acls, export.target_iqn) == {
        topo.b.initiator_iqn.lower()}

    # node B: os-brick, in this process (node B's kernel)
    connector = testbed.iscsi_connector()
    props = export.connection_properties()
    device = connector.connect_volume(props)
    cleanup(testbed.iscsi_logout, export)       # fallback: iscsiadm
    path = device['path']
    assert testbed.sha256_of_device(path, size) == testbed.sha256(data)

    new = testbed.pattern(12, 1 * MiB)
    testbed.write_direct(path, 3 * MiB, new)
    expected = data[:3 * MiB] + new + data[4 * MiB:]
    # node A sees node B's write on its LV
    assert node_a.call(testbed.sha256_of_device, lv) == \
        testbed.sha256(expected)

    connector.disconnect_volume(props, device)
    assert export.target_iqn not in testbed.iscsi_sessions().values()
    node_a.call(testbed.unexport_iscsi_rtslib, export)
    assert export.target_iqn not in node_a.call(testbed.lio_targets)
