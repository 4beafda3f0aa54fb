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

"""Requests that reach a set-back move before it is rolled forward.

A stale whole save sets a committed move back to ``preparing`` while the
volume record names the destination (R14-4; see test_rewound_move).
Until node-b's monitor (or a start, or a detach there) rolls it forward,
the volume's owner, Nova and an operator may ask for anything: another
attach (a multiattach volume's, a third node's), a detach, a migration
or a retype, an extend, a snapshot.  What a user needs: no write lost,
no copy of the volume reachable from a node that should not have it, no
copy removed or hydrated from while another node may still write it,
and a refusal that says the volume is moving rather than a volume left
broken.
"""

from unittest import mock

from cinder import exception
from cinder.tests.unit import fake_constants as fake
from cinder.tests.unit import fake_snapshot

from cinder_dmclone import dmsetup
from cinder_dmclone import move
from tests.harness import fake_cluster
from tests.harness.fake_cluster import HANDLE
from tests.harness.fake_cluster import LV
from tests.harness.fake_cluster import LV_PATH
from tests.harness.fake_cluster import META
from tests.harness.fake_cluster import SECTORS
from tests.harness.fake_cluster import VOLUME_ID
from tests.unit import test_driver
from tests.unit import test_rewound_move
from tests.unit import test_two_nodes

IQN = fake_cluster.FakeTargetIQN
INSTANCE2_ID = test_two_nodes.INSTANCE2_ID
INSTANCE3_ID = '5e1b8b7a-6d1e-4a8f-9a2b-3c4d5e6f7a80'
NODE_C = {'host': 'node-c', 'ip': '10.0.0.3',
          'initiator': 'iqn.2024-01.org.example.node-c:i'}


class WindowMixin(test_rewound_move.RewindMixin):
    """The two set-back moves, and what the window must leave as it was."""

    def rewound_migrated(self, attached=1):
        """``cinder migrate`` to node-b (hydrating), then set back.

        ``attached`` instances attach on node-b first (a multiattach
        volume may have several there).  Returns their attachments.
        """
        stale = self.read_while_preparing()
        self.assertTrue(self.c.migrate(self.b))
        instances = (fake.INSTANCE_ID, INSTANCE2_ID, INSTANCE3_ID)
        atts = [self.c.attach(self.b, instance_uuid=instances[n])[0]
                for n in range(attached)]
        self.assertEqual(move.HYDRATING, self.state())
        self.save_whole(stale)
        return atts

    def source_acl(self):
        return set(self.a.target.exports.get(IQN, {}).get('acl', ()))

    def assert_window_kept(self):
        """The move as the save left it, both copies, node-a serving b only.

        Nothing torn down or wiped, node-a's export admits node-b's
        initiator alone (no other node reaches the source's copy) and
        node-b exports nothing (the clone is not handed to anyone).
        """
        self.assertEqual(move.PREPARING, self.state())
        self.assert_nothing_removed()
        self.assertEqual({self.b.props['initiator']}, self.source_acl())
        self.assertEqual({}, self.b.target.exports)
        self.assertEqual('clone', self.b.dm.devices[HANDLE][0].target)
        self.assertEqual([], self.aborts_sent())

    def reserved_orphans(self):
        return [a for a in self.c.attachments
                if a['attached_host'] is None]


class MultiattachTestCase(WindowMixin, test_two_nodes.ClusterTestCase):
    """A multiattach volume's attaches and detaches in the window.

    A multiattach volume moves only by ``cinder migrate`` (detached);
    while it hydrates on node-b only node-b may attach it (every other
    node's attach is refused while it moves, test_two_nodes
    MigrateTestCase).  The set-back record must open no other way in:
    another node reaching node-a's copy (or node-b's clone) while node-b
    hydrates from node-a and finally retires node-a's copy would lose
    that node's writes, or let it read a copy being wiped.
    """

    def setUp(self):
        super().setUp()
        self.c.multiattach = True

    def test_an_attach_on_the_source_node_is_refused(self):
        self.rewound_migrated()
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.c.attach, self.a,
                                instance_uuid=INSTANCE2_ID)
        self.assertIn('is possible once the move has finished', str(exc))
        self.assert_window_kept()
        # Nova's attach left its attachment reserved (no connector): it
        # holds nothing, and the move finishes.
        for att in self.reserved_orphans():
            self.c.detach(att)
        self.c.settle()
        self.c.assert_completed()
        # Afterwards node-a reaches the volume on node-b over iSCSI, and
        # its detach takes node-a's ACL away again (no move keeps it).
        att, info = self.c.attach(self.a, instance_uuid=INSTANCE2_ID)
        self.assertEqual('iscsi', info['driver_volume_type'])
        acl = self.b.target.exports[IQN]['acl']
        self.assertIn(self.a.props['initiator'], acl)
        self.c.detach(att)
        self.assertNotIn(self.a.props['initiator'], self.b.target.exports.get(
            IQN, {}).get('acl', ()))

    def test_an_attach_on_a_third_node_is_refused(self):
        # (node-c runs no service of this backend: it would get an
        # iSCSI export of whatever node the record names.)
        self.rewound_migrated()
        volume = self.c.volume()
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.c.call, self.b, self.b.attach, volume,
                                dict(NODE_C))
        self.assertIn('attaching on node-c', str(exc))
        self.assert_window_kept()
        self.assertNotIn(NODE_C['initiator'], self.source_acl())
        self.c.settle()
        self.c.assert_completed()

    def test_a_second_attach_on_the_destination_waits(self):
        # The record cannot tell yet that the clone is the volume: the
        # second instance's attach there is refused until the roll
        # forward, then served by the same clone.
        self.rewound_migrated()
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.c.attach, self.b,
                                instance_uuid=INSTANCE2_ID)
        self.assertIn('attaching it here is possible once the move has '
                      'finished', str(exc))
        self.assert_window_kept()
        for att in self.reserved_orphans():
            self.c.detach(att)
        self.b.monitor.tick()
        self.assertEqual(move.HYDRATING, self.state())
        info = self.c.attach(self.b, instance_uuid=INSTANCE2_ID)[1]
        self.assertEqual('local', info['driver_volume_type'])
        self.assertEqual('clone', self.b.dm.devices[HANDLE][0].target)
        self.c.settle()
        self.c.assert_completed()

    def test_a_detach_of_one_of_two_attachments(self):
        first, second = self.rewound_migrated(attached=2)
        removed = []
        remove_export = self.b.remove_export
        self.mock_object(self.b, 'remove_export',
                         side_effect=lambda *a: removed.append(a)
                         or remove_export(*a))
        self.c.detach(first)
        # The other instance keeps its disk: the clone, still hydrating
        # (the detach rolled the move forward), nothing torn down.
        self.assertEqual(move.HYDRATING, self.state())
        self.assertTrue(self.hydration_on())
        self.assertEqual('clone', self.b.dm.devices[HANDLE][0].target)
        self.assertEqual([], removed)
        self.assert_nothing_removed()
        self.assertEqual([], self.aborts_sent())
        self.c.settle()
        self.c.assert_completed()
        self.c.detach(second)
        self.assertEqual(self.b.host, self.c.db.volumes[VOLUME_ID]['host'])

    def test_both_detached_in_the_window(self):
        first, second = self.rewound_migrated(attached=2)
        self.c.detach(first)
        self.c.detach(second)
        self.assert_nothing_removed()
        self.c.settle()
        self.c.assert_completed()


class DetachRoutedToTheSourceTestCase(WindowMixin,
                                      test_two_nodes.ClusterTestCase):
    """A detach of node-b's attachment that reaches node-a.

    cinder-api routes a detach by the volume record it read: one read
    before the commit (Nova giving up an attach that timed out while
    node-b built, then the commit) reaches node-a with node-b's
    connector, in the window or after it.  node-a's export admits node-b
    alone while the move from node-a is recorded, and node-b's clone
    reads every region it has not copied through that ACL: removing it
    cuts node-b's instance off from most of its disk, and no step of
    the move ever admits node-b again.  node-a keeps it, and passes the
    detach on to node-b (Source.pass_on_detach), which handles it as its
    own: a clone that took writes is held (its ACL stays), one that took
    none is rolled back.
    """

    def older_read(self):
        volume = self.c.volume()
        volume.host = self.a.host
        volume.obj_reset_changes()
        return volume

    def detach_on_a(self, att):
        self.c.call(self.a, self.a.attachment_delete, self.older_read(),
                    att['connector'])
        self.c.attachments.remove(att)

    def test_only_a_move_from_the_node_keeps_its_acls(self):
        # (Any other detach of another node's connector takes its ACL.)
        self.assertFalse(self.a.source.keeps_acl(self.volume(), NODE_C))
        self.rewound_migrated(attached=0)
        self.assertTrue(self.a.source.keeps_acl(self.volume(), NODE_C))
        self.assertFalse(self.b.source.keeps_acl(self.volume(), NODE_C))
        self.c.settle()
        self.c.assert_completed()
        for node in (self.a, self.b):
            self.assertFalse(node.source.keeps_acl(self.volume(), NODE_C))

    def test_the_clones_acl_stays(self):
        att, = self.rewound_migrated()
        self.detach_on_a(att)
        self.assertEqual({self.b.props['initiator']}, self.source_acl())
        self.assert_nothing_removed()
        self.c.settle()
        self.c.assert_completed()

    def test_the_clones_acl_stays_in_a_live_window(self):
        # node-a passes the detach on to node-b, which rolls the move
        # forward, finds writes in its clone and holds it: the ACL the
        # clone reads through stays.
        src, dst = self.rewound_live()
        self.b.dm.write(HANDLE, 3)
        self.detach_on_a(dst)
        self.assertEqual({self.b.props['initiator']}, self.source_acl())
        self.assertEqual(move.CLONED, self.state())
        self.assert_nothing_removed()
        self.assertEqual({VOLUME_ID}, self.b.destination.held)
        self.c.settle()
        self.assertFalse(self.hydration_on())
        self.assertEqual({self.b.props['initiator']}, self.source_acl())

    def test_the_clones_acl_stays_without_a_set_back(self):
        src, dst = self.moved(live=True)
        self.b.dm.write(HANDLE, 3)
        self.detach_on_a(dst)
        self.assertEqual({self.b.props['initiator']}, self.source_acl())
        self.assertEqual(move.CLONED, self.state())
        self.assertEqual({VOLUME_ID}, self.b.destination.held)

    def test_an_unwritten_live_window_goes_back_to_the_source(self):
        # The same detach reaching node-b would roll the move back: so
        # does node-b when node-a passes it on.  The ACL goes with the
        # move's own release.
        src, dst = self.moved(live=True)
        self.detach_on_a(dst)
        self.c.assert_rolled_back()
        self.assertEqual(set(), self.source_acl())

    def test_an_unwritten_set_back_window_goes_back_to_the_source(self):
        src, dst = self.rewound_live()
        self.detach_on_a(dst)
        self.c.assert_rolled_back()
        self.assertEqual(set(), self.source_acl())


class OwnerDetachTestCase(WindowMixin, test_two_nodes.ClusterTestCase):
    """The owner's legacy ``os-terminate_connection`` in the window.

    It reaches the driver of the node the record names with a connector
    of the owner's choosing and deletes no attachment: naming the source
    must not commit a live migration whose source still writes.  (One
    routed to node-a, with node-b's initiator: DetachRoutedToTheSource.)
    """

    def forged(self, host, initiator):
        volume = self.c.volume()
        self.c.call(self.b, self.b.terminate_connection, volume,
                    {'host': host, 'initiator': initiator})

    def test_naming_the_source_commits_nothing(self):
        src, dst = self.rewound_live()
        self.a.dm.openers[HANDLE] = 1       # node-a's instance runs
        self.forged('node-a', self.a.props['initiator'])
        self.c.settle()
        self.assertEqual(move.CLONED, self.state())
        self.assertFalse(self.hydration_on())
        self.assert_nothing_removed()
        self.assertEqual({self.b.props['initiator']}, self.source_acl())


class RebootInTheWindowTestCase(WindowMixin, test_two_nodes.ClusterTestCase):
    """node-b reboots in the window with two instances attached there."""

    def test_both_instances_keep_the_clone_and_it_finishes(self):
        self.c.multiattach = True
        self.rewound_migrated(attached=2)
        self.b.reboot()
        self.b.recover()
        # (Whether it hydrated went with the kernel: cloned, hydration
        # off, until node-a confirms nothing there holds its copy.)
        self.assertNotEqual(move.PREPARING, self.state())
        self.assertEqual('clone', self.b.dm.devices[HANDLE][0].target)
        self.assert_nothing_removed()
        self.c.settle()
        self.c.assert_completed()
        self.assertEqual(2, len([a for a in self.c.attachments
                                 if a['attached_host'] == 'node-b']))


class LiveWindowAttachTestCase(WindowMixin, test_two_nodes.ClusterTestCase):
    """Attaches in a live migration's window, set back.

    The instance runs on node-a and node-b at once; node-a's copy is the
    one it may still write.  Another attach there (a multiattach
    volume's second instance; Cinder lets a multiattach volume be
    reserved while in use), or on a third node (the instance migrating
    on), would be one more writer of a copy the roll-forward must not
    commit or hydrate from while any writer may remain.
    """

    def test_a_second_instance_on_the_source_node_is_refused(self):
        src, dst = self.rewound_live()
        self.c.multiattach = True
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.a, instance_uuid=INSTANCE2_ID)
        self.assert_window_kept()
        self.c.settle()
        # Rolled forward to cloned, hydration off: the source's own
        # attachment still holds the commit.
        self.assertEqual(move.CLONED, self.state())
        self.assertFalse(self.hydration_on())
        self.assertEqual({self.b.props['initiator']}, self.source_acl())
        for att in self.reserved_orphans():
            self.c.detach(att)
        self.c.detach(src)
        self.c.settle()
        self.c.assert_completed()

    def test_a_live_migration_on_to_a_third_node_is_refused(self):
        src, dst = self.rewound_live()
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.c.call, self.b, self.b.attach,
                                self.c.volume(), dict(NODE_C))
        self.assertIn('attaching on node-c', str(exc))
        self.assert_window_kept()
        self.assertNotIn(NODE_C['initiator'], self.source_acl())
        self.c.settle()
        self.assertEqual(move.CLONED, self.state())
        self.assertFalse(self.hydration_on())

    def test_the_source_still_open_holds_the_commit_after_the_window(self):
        # node-a's attachment is deleted in the window (through the API)
        # while its instance still has the copy open: the roll forward
        # must not turn into a commit without node-a's word.
        src, dst = self.rewound_live()
        self.a.dm.openers[HANDLE] = 1
        self.c.detach(src)
        self.c.settle()
        self.assertEqual(move.CLONED, self.state())
        self.assertFalse(self.hydration_on())
        self.assert_nothing_removed()
        self.a.dm.openers[HANDLE] = 0
        self.c.settle()
        self.c.assert_completed()


class MigrationTestCase(WindowMixin, test_two_nodes.ClusterTestCase):
    """``cinder migrate`` and a retype in the window.

    The record says ``preparing``, the volume lives on node-b: whatever
    reads the record must see a volume that moves and refuse, never
    start a second move from it (node-b's clone still reads node-a) nor
    let node-a take the record for its own dead prepare.
    """

    def assert_refused(self, exc, target):
        self.assertIn('a migration to %s is possible once the move has '
                      'finished' % target, str(exc))
        rec = self.c.db.volumes[VOLUME_ID]
        self.assertEqual('error', rec['migration_status'])
        self.assertEqual(self.b.host, rec['host'])
        self.assert_window_kept()

    def test_a_migration_back_to_the_source_is_refused(self):
        self.rewound_migrated(attached=0)
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.c.migrate, self.a)
        self.assert_refused(exc, 'node-a')
        self.c.settle()
        self.c.assert_completed()

    def test_a_locked_migration_gets_its_status_back(self):
        self.rewound_migrated(attached=0)
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.migrate, self.a, lock_volume=True)
        self.assertEqual('available',
                         self.c.db.volumes[VOLUME_ID]['status'])
        self.c.settle()
        self.c.assert_completed()

    def test_a_migration_to_another_backend_gets_no_generic_copy(self):
        self.rewound_migrated(attached=0)
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.c.migrate, self.b,
                                {'host': 'node-c@lvm#lvm',
                                 'capabilities': {}})
        self.assert_refused(exc, 'node-c@lvm#lvm')
        self.c.settle()
        self.c.assert_completed()

    def test_a_migration_routed_to_the_source_by_an_older_read(self):
        # cinder-api read the record before the commit and sent the
        # migration to node-a: node-a must neither move the volume again
        # nor give up the set-back move as its own dead prepare, however
        # old it is.
        self.rewound_migrated(attached=0)
        self.c.now += 100000
        volume = self.c.volume()
        volume.host = self.a.host
        volume.obj_reset_changes()
        exc = self.assertRaises(
            exception.VolumeBackendAPIException, self.c.call, self.a,
            fake_cluster.manager_flow.migrate_volume, self.a, self.c.ctxt,
            volume, self.b.scheduler_host(), self.a._save, self.b.az)
        self.assertIn('possible once the move has finished', str(exc))
        self.assertEqual(self.b.host, self.c.db.volumes[VOLUME_ID]['host'])
        self.assert_nothing_removed()
        self.assertEqual({self.b.props['initiator']}, self.source_acl())
        self.assertEqual([], self.aborts_sent())
        self.c.settle()
        self.c.assert_completed()

    def test_a_generic_copy_cannot_read_the_clone_in_the_window(self):
        # A retype with migration (extra specs that differ beyond the
        # backend) or migrate --force-host-copy: Cinder's manager on
        # node-b asks no driver to migrate; it attaches the volume on
        # node-b itself to copy it (a local connection).  Refused while
        # the record cannot say the clone is the volume.
        self.rewound_migrated(attached=0)
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.c.call, self.b, self.b.attach,
                                self.c.volume(), dict(self.b.props))
        self.assertIn('possible once the move has finished', str(exc))
        self.assert_window_kept()
        self.c.settle()
        self.c.assert_completed()

    def assert_retype_tunes_the_clone(self):
        """A retype's hydration tuning reaches node-b's clone."""
        self.b.destination.tuning = mock.Mock(return_value=(128, 32))
        del self.b.dm.calls[:]
        self.b.destination.retune(self.volume(), {'extra_specs': {}})
        self.assertEqual([('message', HANDLE, 'hydration_threshold', 128),
                          ('message', HANDLE, 'hydration_batch_size', 32)],
                         [c for c in self.b.dm.calls if c[0] == 'message'])

    def test_a_retype_in_the_window_tunes_the_clone(self):
        # A retype the driver takes (no migration): the new type's
        # hydration tuning must reach the clone, which hydrates on.
        self.rewound_migrated(attached=0)
        self.assert_retype_tunes_the_clone()
        self.assertEqual(move.HYDRATING, self.state())
        self.c.settle()
        self.c.assert_completed()

    def test_a_retype_in_a_live_window_tunes_the_clone(self):
        src, dst = self.rewound_live()
        self.assert_retype_tunes_the_clone()
        # (Tuned, never turned on: the source may still write.)
        self.assertEqual(move.CLONED, self.state())
        self.assertFalse(self.hydration_on())


class ExtendSnapshotTestCase(WindowMixin, test_two_nodes.ClusterTestCase):
    """An extend, a snapshot and a snapshot's delete in the window."""

    def test_an_extend_of_a_committed_move_goes_through(self):
        # The move was committed (it hydrates): an extend is mapped past
        # the clone, as for any hydrating move.  Refused, Cinder would
        # leave the volume error_extending for an operator, for a record
        # nobody but a stale save set back.
        self.rewound_migrated()
        self.assertTrue(self.extend_on(self.b))
        self.assertEqual(move.HYDRATING, self.state())
        self.assertEqual(['clone', 'linear'],
                         [s.target for s in self.b.dm.devices[HANDLE]])
        self.assertEqual(SECTORS, self.a.dm.device_sectors(LV_PATH))
        self.c.settle()
        # (Completed, at the new size: assert_completed's table is the
        # old size's.)
        self.c.assert_no_transfer()
        self.assertEqual([dmsetup.linear_segment(0, 2 * SECTORS, LV_PATH)],
                         self.b.dm.devices[HANDLE])
        self.assertEqual({}, self.a.vg.lvs)
        self.assertEqual([], self.c.violations)

    def test_an_extend_in_a_live_window_is_refused(self):
        # The live migration may still roll back to node-a's LV of the
        # old size: refused, and nothing grows on either node.
        src, dst = self.rewound_live()
        exc = self.assertRaises(move.MoveInProgress, self.extend_on, self.b)
        self.assertIn('an extend', str(exc))
        self.assertEqual(SECTORS, self.b.dm.device_sectors(LV_PATH))
        self.assertEqual(SECTORS, self.a.dm.device_sectors(LV_PATH))
        self.assertNotEqual(move.HYDRATING, self.state())
        self.assertFalse(self.hydration_on())
        self.c.detach(src)
        self.c.settle()
        self.c.assert_completed()

    def kept_with_its_metadata_lost(self):
        """A set-back move node-b cannot roll forward (kept, logged)."""
        self.rewound_migrated()
        self.b.reboot()
        self.b.vg.delete(META)
        self.b.recover()
        self.assertEqual(move.PREPARING, self.state())

    def test_an_extend_of_a_move_kept_as_set_back_is_refused(self):
        # Nothing says the move was committed: refused as preparing, and
        # nothing grows on either node.
        self.kept_with_its_metadata_lost()
        self.assertRaises(move.MoveInProgress, self.extend_on, self.b)
        self.assertEqual(SECTORS, self.b.dm.device_sectors(LV_PATH))
        self.assertEqual(SECTORS, self.a.dm.device_sectors(LV_PATH))
        self.assertEqual(move.PREPARING, self.state())

    def test_an_extend_of_a_prepare_the_source_left_is_refused(self):
        # The record names node-a (the source never committed): node-b
        # must not take it for a set-back move and extend its clone.
        stale = self.read_while_preparing()
        self.assertTrue(self.c.migrate(self.b))
        self.save_whole(stale)
        self.c.db.volumes[VOLUME_ID]['host'] = self.a.host
        self.assertRaises(move.MoveInProgress, self.extend_on, self.b)
        self.assertEqual(SECTORS, self.b.dm.device_sectors(LV_PATH))
        self.assertEqual(move.PREPARING, self.state())

    def test_a_retype_of_a_move_kept_as_set_back_changes_nothing(self):
        self.kept_with_its_metadata_lost()
        self.b.destination.tuning = mock.Mock(return_value=(128, 32))
        del self.b.dm.calls[:]
        self.b.destination.retune(self.volume(), {'extra_specs': {}})
        self.assertEqual([], [c for c in self.b.dm.calls
                              if c[0] == 'message'])
        self.assertEqual(move.PREPARING, self.state())
        self.assertIn(LV, self.b.vg.lvs)
        self.assertIn(LV, self.a.vg.lvs)

    def test_an_extend_routed_to_the_source_is_refused(self):
        self.rewound_migrated()
        self.assertRaises(move.MoveInProgress, self.extend_on, self.a)
        self.assertEqual(SECTORS, self.a.dm.device_sectors(LV_PATH))
        self.assert_window_kept()

    def test_a_snapshot_is_refused_on_either_node(self):
        # DMCloneVolumeDriver.create_snapshot: _refuse_reading_elsewhere.
        self.rewound_migrated()
        for node in (self.b, self.a):
            self.assertRaises(move.MoveInProgress,
                              node.source.refuse_if_moving, self.volume(),
                              'a snapshot')
        self.assert_window_kept()
        self.c.settle()
        self.c.assert_completed()


class DriverSnapshotTestCase(test_driver.DriverTestBase):
    """The driver's snapshot calls on node-b in the window.

    (The two-node model has no snapshot path: the driver itself, on
    node-b, whose volume record names it while the move reads
    ``preparing``.)  A snapshot is refused as for any moving volume
    (node-b's LV holds only what it hydrated; the rest is on node-a);
    the delete of the snapshot that refusal left in ``error`` removes
    nothing of the volume's: not its LV, handle or clone metadata.
    """

    def setUp(self):
        super().setUp()
        self.drv = self._make_driver(host='node-b@dmclone#dmclone')
        self.drv.dm = self.dm
        self.records[self.volume.id] = 'node-b@dmclone#dmclone'
        t = move.Move(
            volume_id=self.volume.id, lv_name=test_driver.LV,
            state=move.PREPARING, source_host='node-a@dmclone#dmclone',
            dest_host='node-b@dmclone#dmclone', source_node='node-a',
            dest_node='node-b', region_sectors=8, clone_sectors=2097152,
            target_portal='10.0.0.1:3260', target_iqn=IQN,
            secret='ab' * 16, prepared_at=1, prepare_deadline=2)
        self.db.volume_admin_metadata_get.return_value = t.to_metadata()
        self.lvs[test_driver.LV] = '1.00'

    def test_a_snapshot_is_refused_as_moving(self):
        snap = fake_snapshot.fake_snapshot_obj(self.ctxt, volume_size=1,
                                               volume=self.volume)
        exc = self.assertRaises(move.MoveInProgress,
                                self.drv.create_snapshot, snap)
        self.assertIn('a snapshot is possible once the move has finished',
                      str(exc))
        self.vg.create_lv_snapshot.assert_not_called()

    def test_deleting_the_refused_snapshot_removes_nothing_else(self):
        snap = fake_snapshot.fake_snapshot_obj(self.ctxt, volume_size=1,
                                               volume=self.volume)
        self.dm.devices[test_driver.HANDLE] = ['(the clone)']
        self.drv.delete_snapshot(snap)
        self.vg.delete.assert_not_called()
        self.assertEqual(['(the clone)'],
                         self.dm.devices[test_driver.HANDLE])
