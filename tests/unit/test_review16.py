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

"""Review 16: the roll-forward of a move set back to ``preparing``.

Each test is a sequence in which a stale whole save of the admin
metadata (R14-4) meets another event of the move: what the move should
end as, and what it ends as.
"""

import oslo_messaging

from cinder_dmclone import move
from cinder_dmclone import peer
from tests.harness import fake_cluster
from tests.harness.fake_cluster import HANDLE
from tests.harness.fake_cluster import LV
from tests.harness.fake_cluster import VOLUME_ID
from tests.unit import test_rewound_move
from tests.unit import test_two_nodes


class RewoundRollbackTestCase(test_rewound_move.RewindMixin,
                              test_two_nodes.ClusterTestCase):
    """A live migration that fails while its record is set back."""

    def host(self):
        return self.c.db.volumes[VOLUME_ID]['host']

    # R16-1 (fixed): a rollback cut short after its teardown, then set
    # back.  The rollback's teardown wiped node-b's clone; node-b died
    # before it pointed the record back at node-a.  Unset back, node-b's
    # start finishes the rollback (cloned, no data LV: ROLL_BACK).  Set
    # back to preparing, the record named node-b, which holds nothing,
    # while the instance on node-a writes the only copy; nothing ended
    # the move.  Now node-b's start sees its own mark of the move's
    # rollback, and LVM's listing shows nothing of the move there (no
    # data LV, no metadata LV, no handle; review 17: never brick's
    # lookup alone): the move is set to cloned (a compare-and-set on
    # preparing) and rolled back as an unset-back cut rollback is
    # (Destination._emptied, Destination._roll_back_emptied).
    def test_a_rollback_cut_short_then_set_back_is_finished(self):
        stale = self.read_while_preparing()
        src, dst = self.moved(live=True)
        self.assertEqual(move.CLONED, self.state())
        self.c.restart_before_timeout = False
        self.c.crash_at(self.b.store, 'move_volume')
        # Nova rolls the live migration back: node-b's detach first.
        self.assertRaises(oslo_messaging.MessagingTimeout,
                          self.c.detach, dst)
        self.assertEqual({}, self.b.vg.lvs)
        self.assertEqual(self.b.host, self.host())
        self.save_whole(stale)
        self.c.restart(self.b)
        self.c.settle(ticks=8)
        self.assertEqual([], self.c.violations)
        self.assertIn(LV, self.a.vg.lvs)
        self.assertTrue(self.a.vg.lvs[LV]['complete'])
        self.assertEqual(self.a.host, self.host())
        self.assertIsNone(self.c.transfer())

    def cut_short_then_set_back(self):
        """R16-1's record: node-b empty, down, its rollback not recorded.

        Returns node-a's attachment (the instance's) and node-b's (whose
        detach failed: Nova's rollback leaves it).
        """
        stale = self.read_while_preparing()
        src, dst = self.moved(live=True)
        self.c.restart_before_timeout = False
        self.c.crash_at(self.b.store, 'move_volume')
        self.assertRaises(oslo_messaging.MessagingTimeout,
                          self.c.detach, dst)
        self.save_whole(stale)
        self.stale = stale
        return src, dst

    def assert_back_on_a(self):
        """The volume is node-a's whole copy again, and no longer moves."""
        self.c.settle(ticks=8)
        self.assertEqual([], self.c.violations)
        self.assertIsNone(self.c.transfer())
        self.assertEqual(self.a.host, self.host())
        self.assertEqual(self.a.az,
                         self.c.db.volumes[VOLUME_ID]['availability_zone'])
        self.assertEqual([LV], list(self.a.vg.lvs))
        self.assertTrue(self.a.vg.lvs[LV]['complete'])
        self.assertIn(HANDLE, self.a.dm.devices)
        self.assertEqual([], self.a.wiped)
        self.assertEqual({}, self.b.vg.lvs)
        self.assertEqual({}, self.b.dm.devices)
        acl = self.a.target.exports.get(test_rewound_move.IQN, {}).get(
            'acl', ())
        self.assertNotIn(self.b.props['initiator'], acl)

    def restart_b_crashing_at(self, obj, attr, when):
        """node-b's start dies at ``obj.attr``; it starts again."""
        record = self.c.crash_at(obj, attr, when=when)
        self.assertRaises(fake_cluster.Crash, self.c.restart, self.b)
        self.assertTrue(record['fired'])
        self.c.restart(self.b)

    def test_the_finished_rollback_moves_again(self):
        src, dst = self.cut_short_then_set_back()
        self.c.restart(self.b)
        self.assert_back_on_a()
        self.c.detach(dst)
        self.c.detach(src)
        self.c.attach(self.b)
        self.c.settle()
        self.c.assert_completed()

    def test_a_crash_after_the_state_is_set_to_cloned(self):
        # The record is then the one an unset-back cut rollback leaves.
        self.cut_short_then_set_back()
        self.restart_b_crashing_at(self.b.store, 'roll_forward', 'after')
        self.assert_back_on_a()

    def test_a_crash_before_the_state_is_set_to_cloned(self):
        self.cut_short_then_set_back()
        self.restart_b_crashing_at(self.b.store, 'roll_forward', 'before')
        self.assert_back_on_a()

    def test_a_crash_after_the_record_names_node_a_again(self):
        self.cut_short_then_set_back()
        self.restart_b_crashing_at(self.b.store, 'move_volume', 'after')
        self.assert_back_on_a()

    def test_node_a_ends_it_once_the_record_names_it(self):
        # node-b dies again after pointing the record at node-a, and
        # stays down: node-a's restart ends the move (never committed).
        self.cut_short_then_set_back()
        self.c.crash_at(self.b.store, 'move_volume', when='after')
        self.assertRaises(fake_cluster.Crash, self.c.restart, self.b)
        self.b.down = True
        self.assertEqual(self.a.host, self.host())
        self.c.restart(self.a)
        # (Aborted: no longer moving; node-b's start forgets it.)
        self.assertIsNone(self.a.source.load(VOLUME_ID))
        self.b.down = False
        self.c.restart(self.b)
        self.assert_back_on_a()

    def test_a_crash_before_the_move_is_cleared(self):
        self.cut_short_then_set_back()
        self.restart_b_crashing_at(self.b.store, 'clear', 'before')
        self.assert_back_on_a()

    def test_node_a_down_while_node_b_finishes(self):
        # node-a's export for node-b cannot be dropped now (as in any
        # rollback whose release fails): its ACL goes with the retried
        # detach of node-b's attachment, which Cinder now routes to
        # node-a.
        src, dst = self.cut_short_then_set_back()
        self.a.down = True
        self.c.restart(self.b)
        self.assertIsNone(self.c.transfer())
        self.assertEqual(self.a.host, self.host())
        self.a.down = False
        self.c.restart(self.a)
        self.c.detach(dst)
        self.assert_back_on_a()

    def test_set_back_again_while_rolled_back(self):
        # The state written (cloned) set back again before the rest of
        # the rollback: the next start finishes it the same way.
        self.cut_short_then_set_back()
        roll_forward = self.b.store.roll_forward
        rewinds = []

        def set_back_again(ctxt, t, state):
            roll_forward(ctxt, t, state)
            if not rewinds:
                rewinds.append(True)
                self.save_whole(self.stale)
                raise fake_cluster.Crash('set back again, then died')
        self.mock_object(self.b.store, 'roll_forward',
                         side_effect=set_back_again)
        self.assertRaises(fake_cluster.Crash, self.c.restart, self.b)
        self.assertEqual(move.PREPARING, self.state())
        self.c.restart(self.b)
        self.assert_back_on_a()

    def test_set_back_again_once_rolled_back(self):
        # The record names node-a then: a prepare left by node-a, which
        # it ends (its restart, or its next attach); never node-b's.
        self.cut_short_then_set_back()
        self.c.restart(self.b)
        self.assertIsNone(self.c.transfer())
        self.save_whole(self.stale)
        self.c.restart(self.b)
        self.assertEqual(move.PREPARING, self.state())
        self.c.restart(self.a)
        self.assert_back_on_a()

    def test_node_a_restarting_while_set_back(self):
        # node-a keeps exporting its copy for node-b until node-b ends
        # the move.
        self.cut_short_then_set_back()
        self.a.reboot()
        self.a.recover()
        self.assertEqual(move.PREPARING, self.state())
        self.assertIn(HANDLE, self.a.dm.devices)
        self.c.restart(self.b)
        self.assert_back_on_a()

    def test_a_delete_while_set_back_is_left_to_the_delete(self):
        # (Cinder's start on node-b goes on with a delete it was running:
        # the record must still name node-b then.)
        src, dst = self.cut_short_then_set_back()
        self.c.db.volumes[VOLUME_ID]['status'] = 'deleting'
        self.c.restart(self.b)
        self.assertEqual(move.PREPARING, self.state())
        self.assertEqual(self.b.host, self.host())
        self.assertEqual([LV], list(self.a.vg.lvs))
        self.assertEqual([], self.a.wiped)
        self.c.attachments[:] = []
        self.c.delete()
        self.c.settle(ticks=4)
        self.c.assert_deleted()

    def test_a_delete_once_rolled_back(self):
        src, dst = self.cut_short_then_set_back()
        self.c.restart(self.b)
        self.assert_back_on_a()
        self.c.detach(dst)
        self.c.detach(src)
        self.c.delete()
        self.c.settle(ticks=4)
        self.c.assert_deleted()

    # R16-2 (fixed): node-b's detach (Nova's rollback of the live
    # migration) while the record is set back was taken for nothing
    # (Destination.detached: not cloned).  Rolled forward afterwards, the
    # move stayed cloned, held by node-a's attachment, with the instance
    # on node-a and the record naming node-b; the monitor never rolled it
    # back (only a restart of node-b's service did), so the volume stayed
    # "moving" and any attach elsewhere was refused meanwhile.
    def test_the_destinations_detach_while_set_back_rolls_back(self):
        stale = self.read_while_preparing()
        src, dst = self.moved(live=True)
        self.save_whole(stale)
        self.c.detach(dst)
        self.assertIsNone(self.c.transfer())
        self.c.settle(ticks=8)
        self.assertEqual([], self.c.violations)
        self.assertIsNone(self.c.transfer())
        self.assertEqual(self.a.host, self.host())
        self.assertEqual({}, self.b.vg.lvs)
        self.assertIn(LV, self.a.vg.lvs)
        self.assertTrue(self.a.vg.lvs[LV]['complete'])

    def test_a_written_clone_detached_while_set_back_is_held(self):
        # (The instance ran on node-b: its writes are never rolled back.)
        stale = self.read_while_preparing()
        src, dst = self.moved(live=True)
        self.b.dm.write(HANDLE, 3)
        self.save_whole(stale)
        self.c.detach(dst)
        self.assertEqual(move.CLONED, self.state())
        self.assertFalse(self.hydration_on())
        self.assertIn(VOLUME_ID, self.b.destination.held)
        self.assertIn(LV, self.b.vg.lvs)
        self.assertIn(LV, self.a.vg.lvs)
        self.assertEqual([], self.b.wiped)
        self.assertEqual([], self.c.violations)

    def test_a_committed_move_detached_while_set_back_goes_on(self):
        # An attach's move (hydrating): node-b's detach is the instance's
        # end there; the move is rolled forward and finishes.
        stale = self.read_while_preparing()
        src, dst = self.moved()
        self.save_whole(stale)
        self.c.detach(dst)
        self.assertEqual(move.HYDRATING, self.state())
        self.c.settle()
        self.c.assert_completed()

    def test_a_prepare_that_is_not_set_back_waits_for_nothing(self):
        # The record names node-a: a detach on node-b of a move being
        # prepared takes no lock (the source holds it while node-b
        # builds) and changes nothing.
        stale = self.read_while_preparing()
        src, dst = self.moved(live=True)
        self.save_whole(stale)
        self.c.db.volumes[VOLUME_ID]['host'] = self.a.host
        self.c.busy.add('dmclone-%s' % VOLUME_ID)
        self.assertFalse(self.b.destination.detached(
            self.c.volume(), dict(self.b.props)))
        self.assertEqual([], self.c.violations)
        self.assertEqual(move.PREPARING, self.state())
        self.assertIn(HANDLE, self.b.dm.devices)


class RewoundFinalizationTestCase(test_rewound_move.RewindMixin,
                                  test_two_nodes.ClusterTestCase):
    """A move set back while its destination finalizes it."""

    def retire_fails_once_set_back(self, stale):
        """node-a cannot retire now; the stale save lands meanwhile."""
        send = self.b.destination.send
        failed = []

        def retire_fails(ctxt, volume, t, host, op):
            if op == peer.RETIRE and not failed:
                failed.append(True)
                self.save_whole(stale)
                raise RuntimeError('handle held open for a moment')
            return send(ctxt, volume, t, host, op)
        self.mock_object(self.b.destination, 'send',
                         side_effect=retire_fails)
        return failed

    # R16-3 (fixed): set back after the swap to linear, before node-a
    # retired its copy.  node-b's clone was gone (linear, metadata LV
    # removed), so the move was kept as "cannot be rolled forward"; the
    # pending finalization failed at every tick (its transition expects
    # hydrating), and was forgotten at a restart: node-a's old copy and
    # its export admitting node-b were never retired.  Now a set-back
    # move that node-b marked as swapped (review 17: an abandon maps the
    # LV linearly too), whose handle here is still linear over its data
    # LV, while the record still names the source's export, is rolled
    # forward to finalizing (Destination._swapped), and the finalization
    # retires (and wipes) the source's copy.
    def test_set_back_while_finalizing_still_retires_the_source(self):
        stale = self.read_while_preparing()
        self.moved()
        failed = self.retire_fails_once_set_back(stale)
        self.c.settle(ticks=8)
        self.assertEqual([True], failed)
        self.assertEqual([], self.c.violations)
        self.assertEqual({}, self.a.vg.lvs)
        self.assertEqual({}, self.a.target.exports)
        self.assertIsNone(self.c.transfer())
        self.c.assert_completed()

    def failed_once_set_back(self):
        """The finalization failed, the record set back since.

        node-a refuses to retire for the whole tick (the finalization's
        retry after the tick too, each time with the record set back),
        then lets it be.
        """
        stale = self.read_while_preparing()
        self.moved()
        send = self.b.destination.send
        refusing = [True]
        failed = []

        def retire_refused(ctxt, volume, t, host, op, **kwargs):
            if op == peer.RETIRE and refusing:
                self.save_whole(stale)
                failed.append(True)
                raise RuntimeError('handle held open for a moment')
            return send(ctxt, volume, t, host, op, **kwargs)
        self.mock_object(self.b.destination, 'send',
                         side_effect=retire_refused)
        self.c.tick(self.b)
        self.assertEqual([True, True], failed)
        refusing.clear()
        self.assertEqual(move.PREPARING, self.state())
        self.assertEqual({VOLUME_ID}, self.b.destination.pending_finalize)

    def test_a_restart_of_node_b_finishes_it(self):
        # (The service only: the kernel keeps the linear handle.)
        self.failed_once_set_back()
        self.b.restart()
        self.b.recover()
        self.c.settle()
        self.c.assert_completed()

    def test_a_restart_of_node_a_finishes_it(self):
        self.failed_once_set_back()
        self.a.reboot()
        self.a.recover()
        self.c.settle()
        self.c.assert_completed()

    def test_a_reboot_of_node_b_keeps_both_copies(self):
        # The reboot took the linear handle: nothing on node-b tells the
        # whole copy from a clone that lost its metadata LV (partly
        # copied), so nothing is retired, nothing removed: reported for
        # an operator, as before R16-3's fix.
        self.failed_once_set_back()
        self.b.reboot()
        self.b.recover()
        self.c.settle(ticks=8)
        self.assertEqual(move.PREPARING, self.state())
        self.assertTrue(self.b.vg.lvs[LV]['complete'])
        self.assertIn(LV, self.a.vg.lvs)
        self.assertIn(HANDLE, self.a.dm.devices)
        self.assertEqual([], self.a.wiped)
        self.assertEqual([], self.b.wiped)
        self.assertEqual([], self.c.violations)
        self.assertIn('rewound', ' '.join(
            str(c) for c in self.log.error.call_args_list))

    def test_set_back_again_after_the_roll_forward(self):
        stale = self.read_while_preparing()
        self.moved()
        send = self.b.destination.send
        failed = []

        def retire_fails_twice(ctxt, volume, t, host, op):
            if op == peer.RETIRE and len(failed) < 2:
                failed.append(True)
                self.save_whole(stale)
                raise RuntimeError('handle held open for a moment')
            return send(ctxt, volume, t, host, op)
        self.mock_object(self.b.destination, 'send',
                         side_effect=retire_fails_twice)
        self.c.settle(ticks=8)
        self.assertEqual([True, True], failed)
        self.c.assert_completed()

    def test_a_crash_after_the_roll_forward(self):
        self.failed_once_set_back()
        self.c.crash_at(self.b.store, 'roll_forward', when='after')
        self.c.settle(ticks=8)
        self.c.assert_completed()

    def test_a_crash_of_node_a_in_the_retire(self):
        self.failed_once_set_back()
        self.c.crash_at(self.a.source, 'retire')
        self.c.settle(ticks=8)
        self.c.assert_completed()

    def test_a_delete_while_set_back_removes_both_copies(self):
        self.failed_once_set_back()
        self.c.delete()
        self.c.settle(ticks=4)
        self.c.assert_deleted()
        self.assertTrue(any('-dmcwipe-' in p for p in self.a.wiped))
        self.assertTrue(any('-dmcwipe-' in p for p in self.b.wiped))

    def test_not_once_the_source_export_is_forgotten(self):
        # A record that no longer names the source's export: its copy
        # may have been retired and the volume have moved on since (a
        # copy saved long after it was read); kept for an operator.
        self.failed_once_set_back()
        self.c.db.volumes[VOLUME_ID]['provider_location'] = None
        self.c.settle(ticks=4)
        self.assertEqual(move.PREPARING, self.state())
        self.assertIn(LV, self.a.vg.lvs)
        self.assertEqual([], self.a.wiped)
        self.assertEqual([], self.b.wiped)
