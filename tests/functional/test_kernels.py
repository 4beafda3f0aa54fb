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

"""The separate-kernel testbed itself: what a multi-node cloud gives.

``tools/testbed/run --layout separate`` boots every node as its own guest
kernel on one switched segment.  Before any scenario relies on it, these
tests prove the three things the one-kernel layout could not give: each
node is a kernel of its own (its own boot, initiator, LIO and volume
groups), iSCSI works in both directions (so a volume can move back), and
a node can be powered off hard and booted again with its disks, losing
what its kernel held (device-mapper tables, LIO's targets, iSCSI
sessions) and keeping what its disks hold (LVs and their data, the saved
LIO configuration).
"""

import os

import pytest

from tests.harness import testbed
from tests.harness import workers

pytestmark = pytest.mark.layouts('separate')

MiB = testbed.MiB
SIZE = 16 * MiB


def identity():
    """This kernel's boot id, host name and initiator name."""
    with open('/proc/sys/kernel/random/boot_id') as f:
        boot_id = f.read().strip()
    with open('/etc/iscsi/initiatorname.iscsi') as f:
        initiator = f.read().strip().partition('=')[2]
    return {'boot_id': boot_id, 'hostname': os.uname().nodename,
            'initiator': initiator}


def make_lv_on(node, name, cleanup):
    """An LV on ``node``'s VG, removed after the test (from outside)."""
    vg = testbed.topology().node(node).vg
    testbed.lvm('lvcreate', '-q', '-y', '-n', name, '-L', '%db' % SIZE, vg,
                node=node)
    cleanup(testbed.lvm, 'lvremove', '-q', '-f', '%s/%s' % (vg, name),
            node=node, check=False)
    return testbed.lv_path(vg, name)


def test_every_node_runs_its_own_kernel(topo, node_a):
    here = identity()
    there = node_a.call(identity)
    assert there['boot_id'] != here['boot_id']
    assert (here['hostname'], there['hostname']) == ('nodeb', 'nodea')
    assert (here['initiator'], there['initiator']) == (
        topo.b.initiator_iqn, topo.a.initiator_iqn)
    # each kernel sees its own volume groups only
    assert topo.a.vg not in testbed.lvm('vgs', '-o', 'vg_name').stdout
    assert topo.b.vg not in testbed.lvm('vgs', '-o', 'vg_name',
                                        node='a').stdout


def test_iscsi_works_both_ways_between_kernels(topo, node_a, cleanup):
    """A exports to B and B exports to A; each side writes, the other reads.

    The one-kernel layout had one initiator (node B): volumes could move
    A to B only.  Here each node logs in to the other's target.
    """
    lv_a = make_lv_on('a', 'ft-a-to-b', cleanup)
    from_a = node_a.call(testbed.write_pattern_digest, lv_a, 31, SIZE)
    export = node_a.call(testbed.export_iscsi, lv_a, 'ft-a-to-b',
                         topo.b.initiator_iqn, 'a')
    cleanup(node_a.call, testbed.unexport_iscsi, export)
    disk = testbed.iscsi_login(export)
    cleanup(testbed.iscsi_logout, export)
    assert testbed.sha256_of_device(disk, SIZE) == from_a

    lv_b = make_lv_on('b', 'ft-b-to-a', cleanup)
    testbed.write_pattern(lv_b, 32, SIZE)
    export = testbed.export_iscsi(lv_b, 'ft-b-to-a', topo.a.initiator_iqn,
                                  node='b')
    cleanup(testbed.unexport_iscsi, export, node='b')
    disk = node_a.call(testbed.iscsi_login, export)
    cleanup(node_a.call, testbed.iscsi_logout, export)
    written_by_a = node_a.call(testbed.write_pattern_digest, disk, 33, SIZE)
    assert testbed.sha256_of_device(lv_b, SIZE) == written_by_a


def test_hard_power_off_keeps_the_disks_and_loses_the_kernel(topo, cleanup):
    lv = make_lv_on('a', 'ft-power', cleanup)
    # a handle over the LV, exported, as the driver stacks a volume
    testbed.run(['dmsetup', 'create', 'ft-power-handle', '--table',
                 '0 %d linear %s 0' % (SIZE // 512, lv)], node='a')
    cleanup(testbed.run, ['dmsetup', 'remove', 'ft-power-handle'],
            node='a', check=False)
    with workers.NodeProcess('a') as node_a:
        written = node_a.call(testbed.write_pattern_digest, lv, 41, SIZE)
        export = node_a.call(testbed.export_iscsi,
                             '/dev/mapper/ft-power-handle', 'ft-power',
                             topo.b.initiator_iqn, 'a')
    # what a node's boot restores LIO from, as the volume service keeps it
    testbed.run([os.path.join(os.path.dirname(topo.python), 'cinder-rtstool'),
                 'save'], node='a')
    cleanup(testbed.run, ['rm', '-f', '/etc/target/saveconfig.json'],
            node='a')

    boot_id = testbed.run(['cat', '/proc/sys/kernel/random/boot_id'],
                          node='a').stdout.strip()
    testbed.power_off('a')
    assert not testbed.answers('a')
    testbed.boot('a')

    assert testbed.run(['cat', '/proc/sys/kernel/random/boot_id'],
                       node='a').stdout.strip() != boot_id
    with workers.NodeProcess('a') as node_a:
        state = node_a.call(testbed.dm_devices)
        targets = node_a.call(testbed.lio_targets)
        assert node_a.call(testbed.sha256_of_device, lv, SIZE) == written
    assert 'ft-power-handle' not in state
    assert targets == []
    saved = testbed.run(['cat', '/etc/target/saveconfig.json'],
                        node='a').stdout
    assert export.target_iqn in saved
