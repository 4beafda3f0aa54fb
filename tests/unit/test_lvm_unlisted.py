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

"""A destination whose volume group LVM cannot list never acts on it.

After a reboot, before a PV is scanned, LVM answers 'Volume group "X"
not found': brick's get_volume reads that as "no such LV"
(Clones.has_data, has_metadata), and LVM's own listing
(privileged.vg_lv_names) fails.  No decision that rolls back, retires,
wipes or gives up a copy may rest on that "absence": the move is kept
as it is, and taken up again once LVM lists the group.
"""

import contextlib
from unittest import mock

from cinder import exception

from cinder_dmclone import driver as dmc_driver
from cinder_dmclone import exception as dmc_exception
from cinder_dmclone import move
from tests.harness import fake_cluster
from tests.harness.fake_cluster import HANDLE
from tests.harness.fake_cluster import LV
from tests.harness.fake_cluster import META
from tests.harness.fake_cluster import VG
from tests.harness.fake_cluster import VOLUME_ID
from tests.unit import test_lost_source
from tests.unit import test_review17
from tests.unit import test_two_nodes


@contextlib.contextmanager
def unlisted(node):
    """``node``'s volume group is not found by LVM for a while."""
    node.vg_unlisted = True
    try:
        with test_review17.lvm_misses(node, names=(LV, META)):
            yield
    finally:
        node.vg_unlisted = False


class UnlistedGroupTestCase(test_two_nodes.ClusterTestCase):

    def host(self):
        return self.c.db.volumes[VOLUME_ID]['host']

    def assert_kept_on_b(self, state=move.CLONED):
        """The move as it was: nothing rolled back, retired or wiped."""
        self.assertEqual([], self.c.violations)
        self.assertEqual(state, self.c.transfer().state)
        self.assertEqual(self.b.host, self.host())
        self.assertIn(LV, self.b.vg.lvs)
        self.assertIn(META, self.b.vg.lvs)
        self.assertIn(LV, self.a.vg.lvs)
        self.assertEqual([], self.a.wiped)
        self.assertEqual([], self.b.wiped)
        self.assertNotIn('release', self.ops())
        self.assertNotIn('retire', self.ops())

    def switched_over_then_rebooted(self):
        """A live migration switched over; node-b wrote, then rebooted.

        The source's detach (Nova's, after the switch-over) was lost
        with node-b's reboot: the move is ``cloned``, its clone holds
        the instance's writes.
        """
        src, dst = self.moved(live=True)
        self.b.dm.write(HANDLE, 2)
        self.c.attachments.remove(src)
        self.b.reboot()
        return dst

    # The defect: recovery.plan took "no data LV" (brick's lenient read)
    # for a rollback's teardown begun, and rolled the window back: the
    # record pointed at node-a, the instance's writes on node-b lost.
    def test_a_switched_over_window_is_kept_at_a_start(self):
        self.switched_over_then_rebooted()
        with unlisted(self.b):
            self.b.recover()
        self.assert_kept_on_b()
        self.assertIn(VOLUME_ID, self.b.moves.recovery.pending_rebuild)

    def test_then_taken_up_again_once_lvm_lists_the_group(self):
        self.switched_over_then_rebooted()
        with unlisted(self.b):
            self.b.recover()
        self.c.settle()
        # (Rebuilt with the writes it holds, committed once node-a
        # confirms its copy closed, then hydrated and finalized.)
        self.c.assert_completed()

    def test_a_failed_migration_with_writes_is_kept_at_a_start(self):
        # (The destination's detach was lost with the reboot: Nova's
        # rollback while node-a holds its attachment.)
        src, dst = self.moved(live=True)
        self.b.dm.write(HANDLE, 2)
        self.c.attachments.remove(dst)
        self.b.reboot()
        with unlisted(self.b):
            self.b.recover()
        self.assert_kept_on_b()
        self.c.settle()
        # The clone, rebuilt, says it took writes: held, never rolled
        # back (as test_written_clone_is_kept_by_recovery_after_a_reboot).
        self.assert_kept_on_b()
        self.assertEqual({VOLUME_ID}, self.b.destination.held)

    def test_a_detach_here_never_rolls_back_on_an_unlisted_group(self):
        # Nova rolls back a live migration that switched over (the
        # source's attachment outlived it) while LVM misses the group:
        # the loaded clone says it took writes.
        src, dst = self.moved(live=True)
        self.b.dm.write(HANDLE, 3)
        with unlisted(self.b):
            try:
                self.c.detach(dst)
            except Exception:
                pass    # (refused: the detach may be retried)
        self.assert_kept_on_b()

    def test_a_finalizing_move_is_not_finalized_unseen_at_a_start(self):
        # A reboot took the clone of a move finalizing: only the clone
        # rebuilt can tell whether its LV is whole, and the source is
        # retired only after its swap.
        self.moved()
        self.c.set_state(self.c.transfer(), move.FINALIZING)
        self.b.reboot()
        with unlisted(self.b):
            self.b.recover()
            self.b.destination.finalize_pending()
            self.c.tick(self.b)
        self.assert_kept_on_b(move.FINALIZING)
        self.c.settle()
        self.c.assert_completed()

    def test_an_unmanage_never_retires_the_source_of_an_unseen_clone(self):
        # finalizing, its clone loaded and still copying: only a clone
        # swapped (its metadata LV gone) may be ended by an unmanage.
        self.moved()
        self.c.set_state(self.c.transfer(), move.FINALIZING)
        with unlisted(self.b):
            try:
                self.b.destination.before_unmanage(self.volume())
            except Exception:
                pass    # (refused: moving)
        self.assert_kept_on_b(move.FINALIZING)
        self.assertEqual('clone', self.b.dm.devices[HANDLE][0].target)


class UnlistedAbandonTestCase(test_two_nodes.ClusterTestCase):
    """cinder-dmclone move abandon-source on an unlisted group."""

    def test_the_abandon_never_ends_the_move_as_lost_whole(self):
        # With its data LV taken for gone, the command ended the move as
        # if a delete had removed it: the clone's handle removed, every
        # region recorded as lost, the move cleared over the LV that
        # holds the copied half.
        h = test_lost_source.Harness(self, hydrated=range(50))
        h.lose_a()
        with unlisted(h.b):
            self.assertRaises(exception.CinderException, h.run)
        self.assertEqual([], h.c.violations)
        self.assertIn('dmclone_state', h.c.transfer_keys())
        self.assertIn(HANDLE, h.b.dm.devices)
        self.assertIn(LV, h.b.vg.lvs)
        self.assertIn(META, h.b.vg.lvs)
        self.assertEqual([], h.zeroed)
        # (Run again once LVM lists the group: abandoned as it should.)
        h.assert_abandoned(h.run())


class UnlistedDeleteTestCase(test_two_nodes.ClusterTestCase):
    """A delete of a volume moving here, while LVM cannot list the group.

    Its teardown here would remove and wipe nothing (brick's "no LV"),
    then the source retire its copy and the move be cleared: the LVs
    here left unwiped, described by nothing.  The delete fails instead,
    nothing changed on either node, and a retry once LVM lists the
    group deletes the volume as ever.
    """

    def migrated(self):
        self.assertTrue(self.c.migrate(self.b))
        self.assertEqual(move.HYDRATING, self.c.transfer().state)

    def assert_nothing_changed(self):
        self.assertEqual([], self.c.violations)
        self.assertEqual(move.HYDRATING, self.c.transfer().state)
        self.assertIn(LV, self.a.vg.lvs)
        self.assertIn(LV, self.b.vg.lvs)
        self.assertIn(META, self.b.vg.lvs)
        self.assertEqual('clone', self.b.dm.devices[HANDLE][0].target)
        self.assertNotEqual({}, self.b.connector.sessions)
        self.assertEqual([], self.a.wiped)
        self.assertEqual([], self.b.wiped)
        self.assertNotIn('retire', self.ops())

    def assert_deleted(self):
        self.assertEqual([], self.c.violations)
        self.c.assert_no_transfer()
        for node in (self.a, self.b):
            self.assertEqual({}, node.vg.lvs)
            # (Renamed first, then wiped: Wiper.discard.)
            self.assertEqual(1, len(node.wiped))

    def test_refused_with_nothing_changed(self):
        self.migrated()
        with unlisted(self.b):
            exc = self.assertRaises(dmc_exception.StepUnlisted,
                                    self.b.destination.delete, self.volume())
        for text in ('Volume %s: its delete is refused on node node-b'
                     % VOLUME_ID, 'cannot list volume group %s' % VG,
                     'nothing was changed', "'vgs %s' on node-b" % VG,
                     'try again'):
            self.assertIn(text, str(exc))
        self.assert_nothing_changed()

    def test_deleted_on_a_retry_once_lvm_lists_the_group(self):
        self.migrated()
        with unlisted(self.b):
            self.assertRaises(exception.VolumeBackendAPIException,
                              self.c.delete)
        self.assert_nothing_changed()
        self.c.delete()
        self.assert_deleted()

    def test_control_a_listed_group_deletes_at_once(self):
        self.migrated()
        self.c.delete()
        self.assert_deleted()


class UnlistedFinalizationTestCase(test_two_nodes.ClusterTestCase):
    """A clone fully hydrated here while LVM cannot list the group.

    Its metadata LV is neither seen gone nor removed: the finalization
    waits, the source is not retired and the move not ended (before: it
    ended with the metadata LV left, and the driver refused the whole
    LV for good).  The next monitor tick once LVM lists the group
    finishes it.
    """

    def hydrated_unlisted(self):
        self.assertTrue(self.c.migrate(self.b))
        with unlisted(self.b):
            self.c.settle()

    def test_waits_with_the_source_kept(self):
        self.hydrated_unlisted()
        self.assertEqual([], self.c.violations)
        self.assertEqual(move.FINALIZING, self.c.transfer().state)
        self.assertIn(META, self.b.vg.lvs)
        self.assertIn(LV, self.a.vg.lvs)
        self.assertEqual([], self.a.wiped)
        self.assertNotIn('retire', self.ops())
        self.assertIn(VOLUME_ID, self.b.destination.pending_finalize)
        self.assertIn('waits to be finalized until LVM lists the volume '
                      'groups here again', str(self.log.warning.mock_calls))
        self.assertIn('cannot list volume group %s' % VG,
                      str(self.log.warning.mock_calls))

    def test_finished_at_the_next_tick_once_lvm_lists_the_group(self):
        self.hydrated_unlisted()
        self.c.tick(self.b)
        self.c.assert_completed()
        self.assertNotIn(META, self.b.vg.lvs)

    def test_control_a_listed_group_finishes_at_once(self):
        self.assertTrue(self.c.migrate(self.b))
        self.c.tick(self.b)
        self.c.assert_completed()


class UnlistedPrepareTestCase(test_two_nodes.ClusterTestCase):
    """A move here while LVM cannot list the group: refused, then taken.

    Whether this node holds an old copy of the volume (which the
    build's first teardown would wipe) cannot be told.
    """

    def test_refused_with_nothing_touched(self):
        with unlisted(self.b):
            exc = self.assertRaises(exception.VolumeBackendAPIException,
                                    self.c.attach, self.b)
        for text in ('Volume %s: its move here from node-a is refused on '
                     'node node-b' % VOLUME_ID,
                     'cannot list volume group %s' % VG,
                     'nothing was changed'):
            self.assertIn(text, str(exc))
        self.assertEqual([], self.c.violations)
        self.assertEqual({}, self.b.vg.lvs)
        self.assertEqual({}, self.b.dm.devices)
        self.assertEqual({}, self.b.connector.sessions)
        self.assertEqual(self.a.host, self.host())

    def test_taken_on_a_retry_once_lvm_lists_the_group(self):
        with unlisted(self.b):
            self.assertRaises(exception.VolumeBackendAPIException,
                              self.c.attach, self.b)
        self.c.settle()
        self.c.attach(self.b)
        self.c.settle()
        self.c.assert_completed()

    def test_control_a_listed_group_takes_it_at_once(self):
        self.c.attach(self.b)
        self.c.settle()
        self.c.assert_completed()

    def host(self):
        return self.c.db.volumes[VOLUME_ID]['host']


class UnlistedOldCopyTestCase(test_lost_source.LostCopyScenario):
    """Node A, back after an abandon, holds the volume's old copy.

    A move back to node A while LVM cannot list its group is refused
    without a word on the copy (it cannot be seen); once LVM lists the
    group, the move is refused for the copy (LostCopyHere), which is
    never wiped.
    """

    def test_refused_while_unlisted_then_for_the_old_copy(self):
        h = self.h
        with unlisted(h.a):
            exc = self.assertRaises(exception.VolumeBackendAPIException,
                                    h.c.attach, h.a)
        self.assertIn('its move here from node-b is refused on node '
                      'node-a', str(exc))
        self.assertEqual([LV], list(h.a.vg.lvs))
        self.assertEqual([], h.a.wiped)
        self.assertEqual({}, h.a.dm.devices)
        h.c.settle()
        self.assertEqual([LV], list(h.a.vg.lvs))
        self.assert_refused(self.assertRaises(
            exception.VolumeBackendAPIException, h.c.attach, h.a))


class UnlistedKeepTestCase(test_two_nodes.ClusterTestCase):
    """A teardown here keeps an old copy; never decided unlisted.

    The teardown of what a move to this node built (an abort, the
    build's first step) keeps a data LV with no metadata LV beside it:
    an old copy of the volume, which no move built.  Before: on a group
    LVM could not list that read "no LV", so nothing to keep; LVM
    listed the group again as Clones.tear_down ran, which wiped it.
    """

    def listed_again_at_the_teardown(self, node):
        """LVM lists ``node``'s group again as Clones.tear_down starts.

        Returns what ends the miss before that.
        """
        stack = contextlib.ExitStack()
        stack.enter_context(unlisted(node))
        tear_down = node.dest.tear_down

        def listed_then_tear_down(*args, **kwargs):
            stack.close()
            return tear_down(*args, **kwargs)
        self.mock_object(node.dest, 'tear_down',
                         side_effect=listed_then_tear_down)
        self.addCleanup(stack.close)
        return stack.close

    def test_the_keep_decision_is_never_made_unlisted(self):
        t = self.saved(state=move.ABORTED)
        self.b.vg.add(LV, '1g')             # an old copy, no metadata LV
        lvm_back = self.listed_again_at_the_teardown(self.b)
        self.assertRaises(dmc_exception.LVMUnlisted,
                          self.b.destination.tear_down, self.volume(), t)
        self.assertEqual([LV], list(self.b.vg.lvs))
        self.assertEqual([], self.b.wiped)
        lvm_back()
        self.b.destination.tear_down(self.volume(), t)
        self.assertEqual([LV], list(self.b.vg.lvs))
        self.assertEqual([], self.b.wiped)

    def test_control_the_moves_own_lv_goes(self):
        t = self.saved(state=move.ABORTED)
        self.b.vg.add(LV, '1g')
        self.b.vg.add(META, '8m')
        self.b.destination.tear_down(self.volume(), t)
        self.assertEqual({}, self.b.vg.lvs)
        self.assertEqual(1, len(self.b.wiped))


def refuse_linear_over_clone(node, volume):
    """DMCloneVolumeDriver._refuse_linear_over_clone of ``volume`` here.

    (What each mapping of a linear handle checks first: Cinder's
    ensure_export at a start, a local attach.)
    """
    drv = mock.Mock(destination=node.destination, vg=node.vg)
    drv.moves.recovery.pending_rebuild = node.moves.recovery.pending_rebuild
    dmc_driver.DMCloneVolumeDriver._refuse_linear_over_clone(drv, volume)


class UnlistedHandleTestCase(test_two_nodes.ClusterTestCase):
    """No LV mapped alone while whether it is whole cannot be told."""

    def test_refused_while_the_metadata_group_is_unlisted(self):
        self.a.reboot()
        with unlisted(self.a):
            exc = self.assertRaises(dmc_exception.StepUnlisted,
                                    refuse_linear_over_clone, self.a,
                                    self.volume())
        for text in ('Volume %s: mapping its LV %s alone is refused on '
                     'node node-a' % (VOLUME_ID, LV),
                     'cannot list volume group %s' % VG,
                     "'vgs %s' on node-a" % VG):
            self.assertIn(text, str(exc))
        # Listed again: mapped.
        refuse_linear_over_clone(self.a, self.volume())

    def test_control_a_listed_group_maps_it(self):
        self.a.reboot()
        refuse_linear_over_clone(self.a, self.volume())

    def test_control_a_listed_metadata_lv_refuses(self):
        # (One no record describes: LVM's listing alone refuses.)
        self.a.reboot()
        self.a.vg.add(META, '8m')
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                refuse_linear_over_clone, self.a,
                                self.volume())
        self.assertIn('being hydrated by a transfer', str(exc))


class AbandonCutShortHandleTestCase(test_two_nodes.ClusterTestCase):
    """A move in ``source_lost``: refused by its record alone."""

    def test_refused_until_the_abandon_is_run_again(self):
        h = test_lost_source.Harness(self, hydrated=range(50), reboot=True)
        h.lose_a()
        h.crash_in = 'probe'
        self.assertRaises(fake_cluster.Crash, h.run)
        h.c.restart(h.b)
        # (Its metadata LV read as gone, or its group unlisted: the
        # record alone refuses, and says what to do.)
        self.mock_object(h.b.destination, 'metadata_here',
                         return_value=False)
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                refuse_linear_over_clone, h.b, h.c.volume())
        self.assertIn('run "cinder-dmclone move abandon-source %s" on this '
                      'node again' % VOLUME_ID, str(exc))
        h.assert_abandoned(h.run())
        refuse_linear_over_clone(h.b, h.c.volume())
