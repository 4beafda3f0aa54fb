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

"""A committed move whose record a stale whole save set back (R14-4).

Cinder's ``Volume.save`` writes a volume's admin metadata whole
(``delete=True``) from the copy its object holds.  A copy read while the
move was ``preparing`` (the API's read for the owner's legacy
``os-attach``), saved after the source committed the move, sets the
state back to ``preparing`` and drops the keys written since (progress,
what a ``cloned`` move waits for, the record's thin-mapped mark), while
the volume record's ``host`` already names the destination.

What a user needs: no write lost, no copy removed while it may be the
only one, and the move finished as if nothing happened, so that the
volume can move again.  In particular the live migration's window
(``cloned``: the source may still write) must never be skipped.
"""

import dataclasses

from cinder import exception

from cinder_dmclone import move
from cinder_dmclone import peer
from tests.harness import fake_cluster
from tests.harness.fake_cluster import HANDLE
from tests.harness.fake_cluster import LV
from tests.harness.fake_cluster import META
from tests.harness.fake_cluster import VOLUME_ID
from tests.unit import test_review11
from tests.unit import test_two_nodes

IQN = fake_cluster.FakeTargetIQN


class RewindMixin(object):
    """The stale copy, read while node-b builds, and its whole save."""

    def read_while_preparing(self):
        """Snapshot the admin metadata as node-b builds the clone.

        Returns the dict the snapshot fills (once: a later move's build
        leaves it as it is).
        """
        stale = {}
        create = self.b.dest.create_volumes

        def read_then_create(t, size_gb):
            if not stale:
                stale.update(self.c.db.volume_admin_metadata_get(
                    self.c.ctxt, self.c.volume_id))
            return create(t, size_gb)
        self.mock_object(self.b.dest, 'create_volumes',
                         side_effect=read_then_create)
        return stale

    def save_whole(self, stale):
        """``Volume.begin_attach``: the stale copy saved with delete=True."""
        self.assertEqual(move.PREPARING, stale['dmclone_state'])
        self.c.db.volume_admin_metadata_update(
            self.c.ctxt, self.c.volume_id, dict(stale, attached_mode='rw'),
            True)
        self.assertEqual(move.PREPARING, self.c.transfer().state)

    def rewound_live(self):
        """A live migration in its ``cloned`` window, set back."""
        stale = self.read_while_preparing()
        src, dst = self.moved(live=True)
        self.assertEqual(move.CLONED, self.state())
        self.save_whole(stale)
        return src, dst

    def state(self):
        return self.c.transfer().state

    def hydration_on(self):
        return bool(self.b.dm.hydration.get(HANDLE))

    def assert_nothing_removed(self):
        """Both copies are where they were, neither wiped."""
        self.assertEqual([], self.c.violations)
        self.assertIn(LV, self.a.vg.lvs)
        self.assertIn(LV, self.b.vg.lvs)
        self.assertIn(META, self.b.vg.lvs)
        self.assertEqual([], self.a.wiped)
        self.assertEqual([], self.b.wiped)
        self.assertEqual(self.b.host,
                         self.c.db.volumes[VOLUME_ID]['host'])

    def aborts_sent(self):
        return [call for call in self.c.rpc.calls
                if call[2] and call[2].get('op') == peer.ABORT]


class LiveMigrationWindowTestCase(RewindMixin,
                                  test_two_nodes.ClusterTestCase):
    """A live migration's move rewound in its ``cloned`` window.

    Both nodes have the volume attached; node-a's instance may still
    write its copy.  Hydrating now would copy regions that node-a writes
    again afterwards, and the finalization would then retire node-a's
    copy with those writes: the move must come back ``cloned``, with
    hydration off, and commit only at node-a's detach.
    """

    def test_rolled_forward_to_cloned_with_hydration_off(self):
        src, dst = self.rewound_live()
        self.c.settle()
        self.assertEqual(move.CLONED, self.state())
        self.assertFalse(self.hydration_on())
        self.assert_nothing_removed()
        # The progress the stale save dropped is published again.
        self.assertEqual('0.0', self.c.transfer_keys()['dmclone_percent'])
        # node-a's detach ends the live migration: commit, then finish.
        self.c.detach(src)
        self.assertEqual(move.HYDRATING, self.state())
        self.c.settle()
        self.c.assert_completed()

    def test_a_reboot_of_the_destination_keeps_the_window(self):
        src, dst = self.rewound_live()
        self.b.reboot()
        self.b.recover()
        self.assertEqual(move.CLONED, self.state())
        self.assertIn(HANDLE, self.b.dm.devices)
        self.assertFalse(self.hydration_on())
        self.c.settle()
        self.assertEqual(move.CLONED, self.state())
        self.assertFalse(self.hydration_on())
        self.assert_nothing_removed()
        self.c.detach(src)
        self.c.settle()
        self.c.assert_completed()

    def test_the_sources_detach_while_rewound_commits_later(self):
        # Nova detaches node-a while the record says preparing: the
        # detach cannot commit then; once rolled forward the move waits
        # for node-a's word that its copy is closed, and commits.
        src, dst = self.rewound_live()
        self.c.detach(src)
        self.assertEqual(move.PREPARING, self.state())
        self.c.settle()
        self.c.assert_completed()

    def test_the_sources_copy_still_open_holds_the_commit(self):
        # node-a's attachment went while rewound, but its instance still
        # holds the copy there (an owner's attachment delete): never
        # hydrated from a copy that still changes.
        src, dst = self.rewound_live()
        self.a.dm.openers[HANDLE] = 1
        self.a.source.CLOSE_WAIT = 0
        self.c.detach(src)
        self.c.settle()
        self.assertEqual(move.CLONED, self.state())
        self.assertFalse(self.hydration_on())
        self.assert_nothing_removed()
        self.a.dm.openers[HANDLE] = 0
        self.c.settle()
        self.c.assert_completed()

    def test_a_commit_cut_short_by_the_rewind_goes_on_hydrating(self):
        # node-a's detach committed: node-b turned hydration on, and the
        # stale save landed before it recorded the commit.  Hydration on
        # says node-a confirmed its copy closed: hydrating.
        stale = self.read_while_preparing()
        src, dst = self.moved(live=True)
        enable = self.b.dest.enable_hydration

        def enable_then_rewind(t):
            enable(t)
            if self.state() == move.CLONED:
                self.save_whole(stale)
        self.mock_object(self.b.dest, 'enable_hydration',
                         side_effect=enable_then_rewind)
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.detach, src)
        self.assertEqual(move.PREPARING, self.state())
        self.b.monitor.tick()
        self.assertEqual(move.HYDRATING, self.state())
        # Nova retries the detach: the commit is recorded already.
        self.c.detach(src)
        self.c.settle()
        self.c.assert_completed()


class AttachMoveTestCase(RewindMixin, test_two_nodes.ClusterTestCase):
    """An attach's move (no attachment on node-a), committed hydrating."""

    def rewound_hydrating(self):
        stale = self.read_while_preparing()
        self.moved()
        self.assertEqual(move.HYDRATING, self.state())
        self.save_whole(stale)

    def test_the_monitor_rolls_it_forward_to_hydrating(self):
        self.rewound_hydrating()
        self.b.monitor.tick()
        self.assertEqual(move.HYDRATING, self.state())
        self.assertTrue(self.hydration_on())
        self.assert_nothing_removed()
        self.c.settle()
        self.c.assert_completed()

    def test_a_restart_of_the_destination_rolls_it_forward(self):
        self.rewound_hydrating()
        self.b.restart()
        self.b.recover()
        self.assertEqual(move.HYDRATING, self.state())
        self.assert_nothing_removed()
        self.c.settle()
        self.c.assert_completed()

    def test_after_a_reboot_the_source_confirms_first(self):
        # The reboot took the clone and whether its hydration was on:
        # the clone comes back with hydration off, as the live
        # migration's window would, and commits once node-a confirms
        # that no instance there holds its copy.
        self.rewound_hydrating()
        self.b.reboot()
        self.b.recover()
        self.assertEqual(move.CLONED, self.state())
        self.assertIn(HANDLE, self.b.dm.devices)
        self.assertFalse(self.hydration_on())
        self.assert_nothing_removed()
        self.c.settle()
        self.assertIn(peer.CLOSED, self.ops())
        self.c.assert_completed()

    def test_a_reboot_with_the_source_down_waits_for_it(self):
        self.rewound_hydrating()
        self.a.down = True
        self.b.reboot()
        self.b.recover()
        self.c.settle()
        self.assertNotEqual(move.HYDRATING, self.state())
        self.assertFalse(self.hydration_on())
        self.assertIn(LV, self.a.vg.lvs)
        self.a.down = False
        self.c.now += 120
        self.c.settle(ticks=8)
        self.c.assert_completed()

    def test_the_source_restarting_while_rewound_exports_again(self):
        # node-a reboots before node-b rolls the move forward: its start
        # must not take the move for one that never went ahead; node-b
        # still reads every region it has not copied from node-a.
        self.rewound_hydrating()
        self.a.reboot()
        self.a.recover()
        self.assertEqual(move.PREPARING, self.state())
        self.assertIn(LV, self.a.vg.lvs)
        self.assertIn(HANDLE, self.a.dm.devices)
        self.assertIn(self.b.props['initiator'],
                      self.a.target.exports[IQN]['acl'])
        self.assertEqual([], self.aborts_sent())
        self.assert_nothing_removed()
        self.c.settle()
        self.c.assert_completed()

    def test_the_prepare_deadline_passing_changes_nothing_on_the_source(self):
        self.rewound_hydrating()
        self.c.now += 100000
        volume = self.c.volume()
        self.a.source.end_stale_prepare(volume)
        self.a.source.give_up_aborted(volume)
        self.a.monitor.tick()
        self.a.restart()
        self.a.recover()
        self.assertEqual(move.PREPARING, self.state())
        self.assertEqual([], self.aborts_sent())
        self.assert_nothing_removed()
        self.assertIn(self.b.props['initiator'],
                      self.a.target.exports[IQN]['acl'])
        self.c.settle()
        self.c.assert_completed()

    def test_a_busy_lock_waits_for_the_next_tick(self):
        # (Another step holds the volume's lock: a delete, an extend.)
        self.rewound_hydrating()
        self.c.busy.add('dmclone-%s' % VOLUME_ID)
        self.b.monitor.tick()
        self.assertEqual(move.PREPARING, self.state())
        self.assert_nothing_removed()
        self.c.busy.clear()
        self.b.monitor.tick()
        self.assertEqual(move.HYDRATING, self.state())

    def test_a_second_caller_finds_it_rolled_forward(self):
        # (The monitor's tick and a start's retry, say: one acts.)
        self.rewound_hydrating()
        t = self.c.transfer()
        volume = self.c.volume()
        self.assertIsNotNone(self.b.destination.roll_forward(volume, t))
        self.assertIsNone(self.b.destination.roll_forward(volume, t))
        self.assertFalse(self.b.destination.drop_stale_prepare(VOLUME_ID, t))
        self.assertEqual(move.HYDRATING, self.state())
        self.assertEqual(1, sum('rolled forward' in str(c)
                                for c in self.log.warning.call_args_list))

    def test_only_the_move_that_was_read(self):
        # The record holds another move by the time the lock is taken.
        self.rewound_hydrating()
        other = dataclasses.replace(self.c.transfer(), secret='cd' * 16)
        self.assertFalse(self.b.destination.drop_stale_prepare(
            VOLUME_ID, other))
        self.assertIsNone(self.b.destination.roll_forward(
            self.c.volume(), other))
        self.assertEqual(move.PREPARING, self.state())

    def test_a_write_of_the_other_node_in_between_wins(self):
        self.rewound_hydrating()
        self.mock_object(self.b.store, 'roll_forward',
                         side_effect=move.MoveStateConflict(
                             volume_id=VOLUME_ID, expected='preparing',
                             found='aborted'))
        self.b.monitor.tick()
        self.assertEqual(move.PREPARING, self.state())
        self.assert_nothing_removed()

    def test_not_while_a_prepare_of_it_runs_here(self):
        self.rewound_hydrating()
        self.b.destination.building.add(VOLUME_ID)
        self.b.monitor.tick()
        self.assertEqual(move.PREPARING, self.state())
        self.assert_nothing_removed()
        self.b.destination.building.discard(VOLUME_ID)
        self.b.monitor.tick()
        self.assertEqual(move.HYDRATING, self.state())

    def test_a_delete_while_rewound_removes_every_copy(self):
        self.rewound_hydrating()
        self.c.delete()
        self.c.settle(ticks=8)
        self.c.assert_deleted()

    def test_a_crash_before_the_roll_forward(self):
        self.rewound_hydrating()
        self.c.crash_at(self.b.store, 'roll_forward')
        self.c.settle(ticks=8)
        self.c.assert_completed()

    def test_a_crash_after_the_roll_forward(self):
        self.rewound_hydrating()
        self.c.crash_at(self.b.store, 'roll_forward', when='after')
        self.c.settle(ticks=8)
        self.c.assert_completed()

    def test_a_reboot_after_the_roll_forward_before_the_rebuild(self):
        self.c.reboot = True
        self.rewound_hydrating()
        self.b.reboot()
        self.c.crash_at(self.b.store, 'roll_forward', when='after')
        self.assertRaises(fake_cluster.Crash, self.b.recover)
        self.c.restart(self.b)
        self.c.settle(ticks=8)
        self.c.assert_completed()

    def test_moves_again_once_finished(self):
        self.rewound_hydrating()
        self.c.settle()
        self.c.assert_completed()
        dst = [a for a in self.c.attachments
               if a['attached_host'] == 'node-b'][0]
        self.c.detach(dst)
        self.c.attach(self.a)
        self.c.settle()
        self.assertIs(self.a, self.c.owner())
        self.assertIsNone(self.c.transfer())
        self.assertEqual([], self.c.violations)


class OwnerTestCase(RewindMixin, test_two_nodes.ClusterTestCase):
    """What a volume's owner can write never steers the roll-forward.

    The owner can set the record back (the legacy ``os-attach``) and
    write the volume's user metadata, which Cinder's ``metadata`` filter
    matches too; the roll-forward reads the admin metadata, the volume's
    host (Cinder's) and node-b's clone only.
    """

    def with_user_metadata(self, metadata):
        volume = self.c.volume

        def owners(volume_id=None):
            v = volume(volume_id)
            v.metadata = dict(metadata)
            v.obj_reset_changes()
            return v
        self.mock_object(self.c, 'volume', side_effect=owners)

    def test_user_metadata_never_skips_the_live_migration_window(self):
        stale = self.read_while_preparing()
        src, dst = self.moved(live=True)
        self.with_user_metadata({'dmclone_state': move.HYDRATING,
                                 'dmclone_thin_mapped': 'True',
                                 'dmclone_dest_host': self.b.host})
        self.save_whole(stale)
        self.b.reboot()
        self.b.recover()
        self.c.settle()
        self.assertEqual(move.CLONED, self.state())
        self.assertFalse(self.hydration_on())
        self.assert_nothing_removed()

    def test_the_owners_rewind_again_is_rolled_forward_again(self):
        stale = self.read_while_preparing()
        self.moved()
        for _ in range(3):
            self.save_whole(stale)
            self.b.monitor.tick()
            self.assertEqual(move.HYDRATING, self.state())
        self.c.settle()
        self.c.assert_completed()


class UndecidableTestCase(RewindMixin, test_two_nodes.ClusterTestCase):
    """Rewound records whose clone no longer tells how far the move went.

    Kept as they are, for an operator, and logged: nothing is rolled
    forward, torn down or retired.
    """

    def errors(self):
        return ' '.join(str(c) for c in self.log.error.call_args_list)

    def test_rewound_after_the_move_finished(self):
        # A copy saved long after it was read: the move finished and was
        # cleared meanwhile.  No metadata LV on node-b: the same as a
        # clone that lost its metadata, which must never be finalized.
        stale = self.read_while_preparing()
        self.moved()
        self.c.settle()
        self.c.assert_completed()
        self.save_whole(stale)
        wiped = list(self.a.wiped)
        self.c.settle(ticks=8)
        self.b.restart()
        self.b.recover()
        # node-a's start tries to export the copy it retired: nothing
        # to export, nothing made.
        self.a.reboot()
        self.a.recover()
        self.assertEqual(move.PREPARING, self.state())
        self.assertIn(LV, self.b.vg.lvs)
        self.assertTrue(self.b.vg.lvs[LV]['complete'])
        self.assertEqual([], self.b.wiped)
        self.assertEqual(wiped, self.a.wiped)
        self.assertEqual({}, self.a.vg.lvs)
        self.assertEqual({}, self.a.target.exports)
        self.assertIn('rewound', self.errors())
        self.assertEqual([], self.c.violations)

    def test_rewound_with_the_metadata_lost(self):
        stale = self.read_while_preparing()
        src, dst = self.moved(live=True)
        self.save_whole(stale)
        self.b.vg.delete(META)
        self.b.reboot()
        self.b.recover()
        self.c.settle(ticks=8)
        self.assertEqual(move.PREPARING, self.state())
        self.assertIn(LV, self.b.vg.lvs)
        self.assertIn(LV, self.a.vg.lvs)
        self.assertEqual([], self.b.wiped)
        self.assertEqual([], self.a.wiped)
        self.assertIn('rewound', self.errors())

    def test_a_delete_after_a_rewind_of_a_finished_move(self):
        # The owner deletes the volume: node-b's LV is the volume (its
        # record names node-b), and goes, wiped, however the record got
        # there.
        stale = self.read_while_preparing()
        self.moved()
        self.c.settle()
        self.save_whole(stale)
        self.c.attachments[:] = []
        self.c.delete()
        self.c.settle(ticks=4)
        self.c.assert_deleted()
        self.assertTrue(any('-dmcwipe-' in p for p in self.b.wiped))

    def test_a_delete_with_the_metadata_lost_removes_both_copies(self):
        stale = self.read_while_preparing()
        self.moved(live=True)
        self.save_whole(stale)
        self.b.reboot()
        self.b.vg.delete(META)
        self.b.recover()
        self.c.attachments[:] = []
        self.c.delete()
        self.c.settle(ticks=4)
        self.c.assert_deleted()
        self.assertTrue(any('-dmcwipe-' in p for p in self.a.wiped))
        self.assertTrue(any('-dmcwipe-' in p for p in self.b.wiped))


class NotNamedHereTestCase(RewindMixin, test_two_nodes.ClusterTestCase):
    """Only the volume record's host, which Cinder writes, says "rewound".

    A ``preparing`` move whose record still names the source is the
    source's: it may give it up, never node-b roll it forward.
    """

    def test_a_prepare_left_by_the_source_is_never_rolled_forward(self):
        stale = self.read_while_preparing()
        self.c.migrate(self.b)
        self.save_whole(stale)
        # (As if the source's last write, the volume's host, never
        # reached the database.)
        self.c.db.volumes[VOLUME_ID]['host'] = self.a.host
        self.c.settle(ticks=2)
        self.assertEqual(move.PREPARING, self.state())


class ThinMappedTestCase(RewindMixin, test_review11.ThinMapClusterTestCase):
    """A thin-mapped clone: hydrating, and only while its pool zeroes."""

    def rewound(self):
        stale = self.read_while_preparing()
        self.assertTrue(self.c.migrate(self.b))
        self.assertEqual(move.HYDRATING, self.state())
        self.save_whole(stale)

    def test_a_reboot_rolls_it_forward_hydrating(self):
        # Its node's mark says the clone was mapped, so built with
        # hydration on: committed.
        self.rewound()
        self.b.reboot()
        self.b.recover()
        self.assertEqual(move.HYDRATING, self.state())
        self.assertTrue(self.hydrating())
        self.c.settle()
        self.c.assert_completed()

    def test_a_reboot_in_a_pool_that_stopped_zeroing_keeps_the_guard(self):
        self.rewound()
        self.b.pool.zeroing = False
        self.b.reboot()
        self.b.recover()
        self.assertEqual(move.HYDRATING, self.state())
        self.assertFalse(self.hydrating())
        self.b.monitor.tick()
        self.assertFalse(self.hydrating())
        self.b.pool.zeroing = True
        self.c.settle()
        self.c.assert_completed()

    def test_the_guard_holds_when_the_monitor_rolls_it_forward(self):
        self.rewound()
        self.b.pool.zeroing = False
        self.b.monitor.tick()
        self.b.monitor.tick()
        self.assertEqual(move.HYDRATING, self.state())
        self.assertFalse(self.hydrating())
        self.b.pool.zeroing = True
        self.c.settle()
        self.c.assert_completed()

    def test_a_copy_older_than_the_clones_move_is_written_over(self):
        # The copy saved was read while an earlier attempt, given up
        # since, was prepared: the clone here is the later move's, and
        # its guard is that move's mark.  Rolled forward, the record
        # would describe another clone, and a rebuild for it drop that
        # mark (with it the guard).  node-b's mark of the move it takes
        # part in (cinder_dmclone.evidence) names the later move: its
        # record is written back, and its guard holds.
        stale = self.read_while_preparing()
        build = self.b.dest.build_clone
        failed = []

        def fail_once(*args, **kwargs):
            if not failed:
                failed.append(True)
                raise exception.VolumeBackendAPIException(data='failed')
            return build(*args, **kwargs)
        self.mock_object(self.b.dest, 'build_clone', side_effect=fail_once)
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.migrate, self.b)
        self.assertIsNone(self.c.transfer())
        del self.b.wiped[:]     # (what the attempt built, wiped)
        self.assertTrue(self.c.migrate(self.b))
        later = self.c.transfer()
        self.save_whole(stale)
        self.assertNotEqual(later.secret, self.c.transfer().secret)
        self.b.pool.zeroing = False
        self.b.monitor.tick()
        self.assertEqual((move.HYDRATING, later.secret),
                         (self.state(), self.c.transfer().secret))
        self.assertFalse(self.hydrating(), 'a clone that may be mapped '
                         'hydrates in a pool that does not zero')
        for restart in (self.b.restart, self.b.reboot):
            restart()
            self.b.recover()
            self.c.settle(ticks=2)
            self.assertEqual(move.HYDRATING, self.state())
            self.assertFalse(self.hydrating())
            self.assertEqual(move.thin_map_tag(later.secret),
                             self.b.marks.read(VOLUME_ID))
        self.assert_nothing_removed()
        self.b.pool.zeroing = True
        self.c.settle()
        self.c.assert_completed()

    def test_an_earlier_mapped_move_does_not_keep_a_later_one(self):
        # node-b mapped an earlier move of the volume: a later live
        # migration to node-b (never mapped), set back, is rolled
        # forward all the same, cloned.
        self.assertTrue(self.c.migrate(self.b))
        self.c.settle()
        self.c.assert_completed()
        src = self.c.attach(self.a)[0]
        self.c.settle()
        self.assertIs(self.a, self.c.owner())
        stale = self.read_while_preparing()
        self.c.attach(self.b)
        self.assertEqual(move.CLONED, self.state())
        self.save_whole(stale)
        self.b.monitor.tick()
        self.assertEqual(move.CLONED, self.state())
        self.assertFalse(self.hydrating())
        self.c.detach(src)
        self.c.settle()
        self.c.assert_completed()

    def test_a_mark_that_cannot_be_read_keeps_it(self):
        self.rewound()
        self.mock_object(self.b.marks, 'read',
                         side_effect=OSError(5, 'Input/output error'))
        self.b.pool.zeroing = False
        self.b.monitor.tick()
        self.assertEqual(move.PREPARING, self.state())
        self.assertFalse(self.hydrating())
        self.assert_nothing_removed()
