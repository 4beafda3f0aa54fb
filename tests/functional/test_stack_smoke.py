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

"""Smoke test of the guest's kernel stack with plain commands only.

LV on node A -> LIO iSCSI export (targetcli, on node A, ACL for node
B) -> login from node B (iscsiadm) -> dm-clone on node B (dest LV on
dmc-b, metadata LV on dmc-b-meta) -> writes -> read back unhydrated ->
hydration -> swap to linear -> the source detached -> data checked ->
everything removed and nothing left behind.  No project code: if this
fails, the testbed or the kernel is at fault, not cinder-dmclone.

Separate kernels: node A's side (its LV, the data written there and the
source's sha256 read back there, its LIO export) runs on node A's own
kernel, through the harness's worker there (``node_a``) and ``node='a'``
commands; node B's side (iscsiadm, the clone) is this process.
"""

import pytest

from tests.harness import testbed
from tests.harness.testbed import MiB

pytestmark = pytest.mark.layouts('separate')

SIZE = 64 * MiB
REGION_SECTORS = 128                     # 64 KiB regions
REGION = REGION_SECTORS * testbed.SECTOR
META_SIZE = 4 * MiB


# Extended since 2026-11-26: CI's machine ran the CI tier at half the
# speed it was sized on (doc/source/contributor/testing.rst).
@pytest.mark.extended
def test_clone_over_iscsi_hydrate_swap_cleanup(topo, node_a, cleanup):
    baseline = testbed.snapshot()
    a, b = topo.a, topo.b
    sectors = SIZE // testbed.SECTOR

    # node A: source LV with known content, exported to node B only
    src = testbed.create_lv(a.vg, 'smoke-src', SIZE, node='a')
    cleanup(testbed.remove_lv, a.vg, 'smoke-src', node='a')
    source_data = testbed.pattern(1, SIZE)
    node_a.call(testbed.write_pattern_digest, src, 1, SIZE)
    export = node_a.call(testbed.export_iscsi, src, 'smoke-src')
    cleanup(node_a.call, testbed.unexport_iscsi, export)

    # node B: log in; the disk shows node A's data
    disk = testbed.iscsi_login(export)
    cleanup(testbed.iscsi_logout, export)
    assert testbed.device_size(disk) == SIZE
    assert testbed.sha256_of_device(disk) == testbed.sha256(source_data)

    # node B: dm-clone over the iSCSI disk, nothing copied yet
    dest = testbed.create_lv(b.vg, 'smoke-dest', SIZE)
    cleanup(testbed.remove_lv, b.vg, 'smoke-dest')
    meta = testbed.create_lv(b.meta_vg, 'smoke-meta', META_SIZE)
    cleanup(testbed.remove_lv, b.meta_vg, 'smoke-meta')
    testbed.zero_device(meta, META_SIZE)
    testbed.run(['dmsetup', 'create', 'smoke-clone', '--table',
                 '0 %d clone %s %s %s %d 1 no_hydration'
                 % (sectors, meta, dest, disk, REGION_SECTORS)])
    cleanup(testbed.dm_remove, 'smoke-clone')
    clone = '/dev/mapper/smoke-clone'
    status = testbed.dm_status('smoke-clone')
    assert 'no_hydration' in status.split(), status
    assert testbed.clone_progress('smoke-clone') == (0, SIZE // REGION)

    # writes through the clone: a whole aligned region, 4 KiB inside
    # another region, the last 4 KiB of the device
    expected = bytearray(source_data)
    writes = [(5 * REGION, REGION, 2),
              (9 * REGION + 8192, 4096, 3),
              (SIZE - 4096, 4096, 4)]
    for offset, length, seed in writes:
        data = testbed.pattern(seed, length)
        testbed.write_direct(clone, offset, data)
        expected[offset:offset + length] = data
    # a full-region write needs no copy, a partial one copies its region
    # first: either way each written region is now hydrated
    assert testbed.clone_progress('smoke-clone') == (3, SIZE // REGION)
    assert testbed.sha256_of_device(clone) == testbed.sha256(expected)
    assert node_a.call(testbed.sha256_of_device, src) == \
        testbed.sha256(source_data)

    # hydrate in the background, wait on the kernel's own progress
    testbed.run(['dmsetup', 'message', 'smoke-clone', '0',
                 'hydration_threshold', '64'])
    testbed.run(['dmsetup', 'message', 'smoke-clone', '0',
                 'hydration_batch_size', '16'])
    testbed.run(['dmsetup', 'message', 'smoke-clone', '0',
                 'enable_hydration'])
    testbed.wait_hydrated('smoke-clone', timeout=600)
    status = testbed.dm_status('smoke-clone')
    assert 'no_hydration' not in status.split(), status

    # swap the clone for a plain linear mapping of the destination
    testbed.run(['dmsetup', 'suspend', 'smoke-clone'])
    testbed.run(['dmsetup', 'load', 'smoke-clone', '--table',
                 '0 %d linear %s 0' % (sectors, dest)])
    testbed.run(['dmsetup', 'resume', 'smoke-clone'])
    assert testbed.dm_table('smoke-clone') == (
        '0 %d linear %s 0' % (sectors, testbed.dm_devno(dest)))

    # the source can go away now
    testbed.iscsi_logout(export)
    node_a.call(testbed.unexport_iscsi, export)
    assert testbed.sha256_of_device(clone) == testbed.sha256(expected)
    assert testbed.sha256_of_device(dest) == testbed.sha256(expected)

    testbed.dm_remove('smoke-clone')
    for vg, lv, node in ((b.meta_vg, 'smoke-meta', 'b'),
                         (b.vg, 'smoke-dest', 'b'),
                         (a.vg, 'smoke-src', 'a')):
        testbed.remove_lv(vg, lv, node=node)
    assert testbed.leaks(baseline) == []
