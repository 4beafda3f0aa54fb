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

"""The driver's node-local lifecycle on the real kernel (node A).

Node A's volume service runs the real driver in node A's network
namespace (LVM on its VG, LIO exports with CHAP and ACLs); node B (this
process) logs in with os-brick's iSCSI connector as a remote host would.
"""

import pytest

from tests.functional import cinder_node
from tests.functional import fixtures
from tests.functional import testbed

# The session's two volume services (see tests/functional/fixtures.py).
cluster = fixtures.cluster

MiB = testbed.MiB
GiB = 1024 * MiB


def handle(volume, node='a'):
    vg = testbed.topology().node(node).vg.replace('-', '--')
    return '/dev/mapper/dmclone-%s-volume-%s' % (vg, volume)


def test_node_local_lifecycle(cluster, topo):
    a = cluster['a']
    vid = cluster.create_volume('a')
    path = handle(vid)
    lv = 'dmc-a/volume-%s' % vid
    assert lv in testbed.list_lvs()
    table = testbed.dm_table(path.split('/')[-1])
    assert table.split()[2] == 'linear', table
    assert testbed.device_size(path) == GiB

    # Local attach on node A: the handle itself, no export.
    info = a.call(cinder_node.manager_initialize_connection, vid,
                  cluster.connector('a'))
    assert info == {'driver_volume_type': 'local',
                    'data': {'device_path': path, 'volume_id': vid,
                             'access_mode': 'rw'}}
    assert testbed.lio_targets() == []
    first = testbed.pattern(1, 4 * MiB)
    testbed.write_direct(path, 0, first)

    # Remote, non-instance attach from node B: iSCSI with CHAP and an ACL
    # for node B's initiator only.
    conn = a.call(cinder_node.manager_initialize_connection, vid,
                  cluster.connector('b'))
    assert conn['driver_volume_type'] == 'iscsi'
    data = conn['data']
    assert data['auth_method'] == 'CHAP'
    assert data['target_portal'] == topo.a.portal
    assert testbed.lio_targets() == [data['target_iqn']]
    acls = testbed.run(['ls', testbed.lio_tpg_path(data['target_iqn'])
                        + '/acls']).stdout.split()
    assert acls == [topo.b.initiator_iqn]
    brick = testbed.iscsi_connector()
    dev = brick.connect_volume(data)
    try:
        assert testbed.read_direct(dev['path'], 0, 4 * MiB) == first
        second = testbed.pattern(2, 1 * MiB)
        testbed.write_direct(dev['path'], 8 * MiB, second)
    finally:
        brick.disconnect_volume(data, dev, force=True)
    assert testbed.read_direct(path, 8 * MiB, 1 * MiB) == second
    a.call(cinder_node.call, 'terminate_connection', vid,
           cluster.connector('b'))
    a.call(cinder_node.call_ctxt, 'remove_export', vid)
    assert testbed.lio_targets() == []

    expected = testbed.sha256_of_device(path)

    # Snapshot, then a clone of the volume and a volume from the snapshot.
    snap = cluster.create_snapshot(vid)
    clone = cluster.create_volume('a', method='create_cloned_volume',
                                  source_id=vid)
    from_snap = cluster.create_volume('a',
                                      method='create_volume_from_snapshot',
                                      source_id=snap)
    testbed.write_direct(path, 0, testbed.pattern(4, MiB))  # after both
    assert testbed.sha256_of_device(handle(clone)) == expected
    assert testbed.sha256_of_device(handle(from_snap)) == expected

    # Deleting a volume with a snapshot is refused; then all goes.
    with pytest.raises(Exception, match='busy|snapshot'):
        a.call(cinder_node.call, 'delete_volume', vid)
    cluster.delete_snapshot(snap)
    for v in (clone, from_snap):
        cluster.delete_volume(v)

    # Extend online: the handle grows with the LV, data stays.
    head = testbed.read_direct(path, 0, 4 * MiB)
    a.call(cinder_node.call, 'extend_volume', vid, 2)
    assert testbed.device_size(path) == 2 * GiB
    assert testbed.read_direct(path, 0, 4 * MiB) == head
    testbed.write_direct(path, 2 * GiB - MiB, testbed.pattern(3, MiB))
    assert testbed.read_direct(path, 2 * GiB - MiB, MiB) == \
        testbed.pattern(3, MiB)
    cluster.set_size(vid, 2)

    cluster.delete_volume(vid)
    assert not any('volume-' in lv for lv in testbed.list_lvs())
    assert not [n for n in testbed.dm_devices() if n.startswith('dmclone')]
