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

"""Review 22 (branch r19-fixes, cb5bcd0): findings as expected failures.

The strict listing (Clones.listed, LVMUnlisted, StepUnlisted) now
decides the destination's prepare, teardown, delete and finalization,
and the driver's linear guard.  What is left on brick's lenient lookup,
or what the new waits leave without a way out, is below.
"""

from cinder import exception
from oslo_messaging import MessagingTimeout

from cinder_dmclone import move
from cinder_dmclone import peer
from tests.harness.fake_cluster import HANDLE
from tests.harness.fake_cluster import LV
from tests.harness.fake_cluster import META
from tests.harness.fake_cluster import VOLUME_ID
from tests.unit import test_lvm_unlisted
from tests.unit import test_two_nodes

unlisted = test_lvm_unlisted.unlisted


class RetireOnAnUnlistedSourceTestCase(test_two_nodes.ClusterTestCase):
    """Source.retire removes the old LV through brick's lenient lookup."""

    def migrated(self):
        self.assertTrue(self.c.migrate(self.b))
        self.assertEqual(move.HYDRATING, self.c.transfer().state)

    # MEDIUM (leak).  Sequence: a volume migrated to node-b hydrates
    # there; node-a (the source) is not listed by LVM for a while when
    # node-b's monitor finalizes (node-a rebooted after node-b had
    # copied everything, its PV scanned late; or its group briefly
    # unreadable).  node-b swaps, removes its metadata LV and sends
    # RETIRE: Source.retire (source.py:1666) drops the export and the
    # handle, then Wiper.discard (wiper.py:68) asks brick's get_volume,
    # which reads 'Volume group not found' as "no such LV", and returns
    # having done nothing -- no error.  node-b forgets the source's
    # export and clears the move.  node-a keeps the tenant's whole old
    # copy, never wiped, described by nothing: the volume still exists,
    # so no start reports it (lvs_of_deleted_volumes), no old-copy key
    # names it, and any later move of the volume back to node-a is
    # refused (StrayCopyHere) until an operator finds it.  The retire
    # should read LVM's own listing and fail (the finalization retries).
    # (Fixed: the Wiper reads LVM's own listing; see test_wiper.py.)
    def test_a_retire_on_an_unlisted_source_leaves_its_lv_unwiped(self):
        self.migrated()
        with unlisted(self.a):
            self.c.settle()
        self.c.settle()
        if self.c.transfer() is None:
            self.assertNotIn(LV, self.a.vg.lvs)         # fails: kept
        self.c.assert_completed()

    # Control: the same finalization with node-a listed wipes its copy.
    def test_control_a_listed_source_is_wiped(self):
        self.migrated()
        self.c.settle()
        self.c.assert_completed()


class FinalizingWithItsMetadataLeftTestCase(test_two_nodes.ClusterTestCase):
    """A finalization that waits after its swap, then a reboot."""

    def swapped_then_rebooted_with_the_source_lost(self):
        self.assertTrue(self.c.migrate(self.b))
        with unlisted(self.b):
            self.c.settle()
        t = self.c.transfer()
        self.assertEqual(move.FINALIZING, t.state)
        self.assertIn(META, self.b.vg.lvs)
        self.assertTrue(self.b.vg.lvs[LV]['complete'])
        # (The swap was made: its end mark, which a fix may read.)
        self.assertTrue(self.b.destination.ended_here(t, move.END_SWAP))
        # node-a is lost for good; node-b reboots.
        self.a.down = True
        self.a.service_up = False
        self.a.has_service = True
        self.a.target.exports.clear()
        self.b.reboot()
        self.b.recover()
        self.c.settle()
        return t

    # LOW (a move that can never end; availability).  Sequence: node-b's
    # monitor finalizes a fully hydrated clone: the swap to linear is
    # made, then remove_metadata waits (clone.py:719: LVM cannot list
    # node-b's group for a moment: the new wait, or a crash right
    # there).  node-b reboots (the handle goes), and node-a is lost for
    # good.  The LV on node-b is whole (the swap's end mark says so)
    # but: recovery plans REBUILD (metadata LV listed, no handle), which
    # needs node-a (SourceUnreachable, retried only while node-a's
    # service is up: never); the driver refuses the handle
    # (pending_rebuild, and the metadata LV); abandon-source refuses a
    # move in finalizing (lost_source.py:224, "use the unmanage path");
    # the unmanage path refuses too, since the metadata LV is still
    # listed (Destination._swapped_away, destination.py:1911).  No
    # documented step ends the move: the volume's owner keeps a whole
    # copy on node-b that nothing will serve.
    # (Fixed: ``cinder-dmclone move abandon-source`` takes such a move,
    # finds every region in the metadata LV, and ends it keeping the
    # volume's status; see test_lost_source's
    # FinalizingWithoutItsSourceTestCase, which starts from the state
    # this test checks.)
    def test_a_swapped_move_with_its_metadata_left_waits_for_the_operator(
            self):
        self.swapped_then_rebooted_with_the_source_lost()
        self.assertNotIn(HANDLE, self.b.dm.devices)
        self.assertEqual(move.FINALIZING, self.c.transfer().state)
        self.assertIn(VOLUME_ID, self.b.moves.recovery.pending_rebuild)
        self.assertIn(META, self.b.vg.lvs)
        self.assertRaises(exception.VolumeIsBusy,
                          self.b.destination.before_unmanage, self.volume())
        self.assertEqual(move.FINALIZING, self.c.transfer().state)


class AbortedAtAnUnlistedDestinationTestCase(test_two_nodes.ClusterTestCase):
    """A move refused at an unlisted destination is left ``aborted``."""

    # LOW (documentation; an inert record).  Sequence: the owner
    # attaches the volume on node-b while LVM cannot list node-b's
    # group: the prepare is refused (StepUnlisted), node-a gives the
    # move up and asks node-b to abort, whose teardown is refused too;
    # node-a records the move ``aborted``.  operations.rst says "an
    # aborted move stays recorded until the node's monitor drops it",
    # but nothing was built on node-b, and the monitor only finds
    # aborted moves through a loaded clone (HydrationTracker.on_status):
    # the record stays once LVM lists the group again, until node-b's
    # service restarts or node-a's deletes or restarts.  (Inert: a
    # later move replaces it.)  (Fixed: node-b remembers the abort it
    # could not finish and resolves the record after each monitor tick,
    # Recovery.retry_aborts.)
    def test_the_aborted_record_is_dropped_once_lvm_lists_again(self):
        with unlisted(self.b):
            self.assertRaises(exception.VolumeBackendAPIException,
                              self.c.attach, self.b)
        self.assertEqual(move.ABORTED, self.c.transfer().state)
        self.assertEqual(self.a.host,
                         self.c.db.volumes[VOLUME_ID]['host'])
        self.c.settle()
        self.assertIsNone(self.c.transfer())
        self.assertEqual({}, self.b.destination.abort_owed)
        self.assertIn(LV, self.a.vg.lvs)
        self.assertEqual([], self.c.violations)

    # While LVM still cannot list node-b's group, the ticks keep the
    # record (nothing removed on a listing that cannot be read) and do
    # not fail; the first tick after LVM lists it again drops it.
    def test_ticks_while_still_unlisted_keep_the_record(self):
        with unlisted(self.b):
            self.assertRaises(exception.VolumeBackendAPIException,
                              self.c.attach, self.b)
            self.c.settle()
            self.assertEqual(move.ABORTED, self.c.transfer().state)
            self.assertIn(VOLUME_ID, self.b.destination.abort_owed)
        self.c.settle()
        self.assertIsNone(self.c.transfer())
        self.assertEqual({}, self.b.destination.abort_owed)

    # Control: the volume is usable on node-a meanwhile, and a later
    # attach on node-b, once LVM lists the group, moves it.
    def test_control_a_later_attach_moves_it(self):
        with unlisted(self.b):
            self.assertRaises(exception.VolumeBackendAPIException,
                              self.c.attach, self.b)
        self.assertEqual([], self.b.wiped)
        self.assertIn(LV, self.a.vg.lvs)
        self.c.attach(self.b)
        self.c.settle()
        self.c.assert_completed()
        # (The abort owed for the refused move is forgotten: the record
        # describes the later move.)
        self.assertEqual({}, self.b.destination.abort_owed)


class AbortOwedTestCase(test_two_nodes.ClusterTestCase):
    """Review of the fix above (Recovery.retry_aborts): its three findings.

    Each failed against the first version of the fix.
    """

    def refused_while_unlisted(self):
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.b)
        self.assertEqual(move.ABORTED, self.c.transfer().state)
        self.assertIn(VOLUME_ID, self.b.destination.abort_owed)

    def warnings(self, starting=''):
        return [c.args[0] for c in self.log.warning.call_args_list
                if c.args[0].startswith(starting)]

    # MEDIUM (a log flooded, an entry kept for good).  Sequence: the
    # abort at node-b fails (its group unlisted); the owner deletes the
    # volume on node-a, where it lives, and Cinder removes its row.
    # Every tick then read the record of a volume that no longer exists
    # (VolumeNotFound), logged a traceback and kept the entry, until
    # node-b's service restarted.
    def test_a_deleted_volume_is_forgotten(self):
        with unlisted(self.b):
            self.refused_while_unlisted()
            self.c.delete()
            self.assertNotIn(LV, self.a.vg.lvs)
            self.c.db.volumes.pop(VOLUME_ID)       # (Cinder: the row goes)
        self.log.reset_mock()
        for _ in range(3):
            self.c.tick(self.b)
        self.assertEqual({}, self.b.destination.abort_owed)
        self.assertEqual([], self.warnings('Removing what the aborted'))

    # LOW (log volume).  Sequence: the group stays unlisted; each tick
    # resolved the record twice (retry_aborts, and retry_rebuilds for
    # the AWAIT_LVM the first attempt filed), four warnings a tick.
    # Once a tick now: the record is the abort's to retry, not a
    # rebuild's.
    def test_an_unlisted_group_is_tried_once_a_tick(self):
        with unlisted(self.b):
            self.refused_while_unlisted()
            self.c.tick(self.b)
            self.log.reset_mock()
            self.c.tick(self.b)
            self.assertNotIn(VOLUME_ID,
                             self.b.moves.recovery.pending_rebuild)
            self.assertLessEqual(len(self.warnings()), 2)
            self.assertEqual(move.ABORTED, self.c.transfer().state)
        self.c.settle()
        self.assertIsNone(self.c.transfer())

    # LOW (an inert record, the finding the fix is for, by another way).
    # Sequence: node-b's prepare fails, node-a asks it to abort, the
    # abort succeeds at node-b, and its answer is lost (an RPC timeout):
    # node-a records the move aborted, and nothing was owed or loaded
    # at node-b, so the record stayed until a restart.
    def test_a_lost_answer_to_an_abort_that_succeeded(self):
        send = self.a.source.send

        def answer_lost(ctxt, volume, t, host, op, **kw):
            send(ctxt, volume, t, host, op, **kw)
            if op == peer.ABORT:
                raise MessagingTimeout('answer lost')
        self.mock_object(self.a.source, 'send', side_effect=answer_lost)
        self.mock_object(self.b.destination, '_build',
                         side_effect=exception.VolumeBackendAPIException(
                             data='build failed'))
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.b)
        self.assertEqual(move.ABORTED, self.c.transfer().state)
        self.c.settle()
        self.assertIsNone(self.c.transfer())
        self.assertEqual({}, self.b.destination.abort_owed)
        self.assertIn(LV, self.a.vg.lvs)
