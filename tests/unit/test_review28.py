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

"""Review 28: a mark of a deleted volume no longer keeps the LV (r24-2).

84e5440 made another mark of this node keep a deleted volume's clone
only while that mark's volume exists (recovery._volume_exists).  Since a
live volume whose ``name`` is the LV is found first (volume_of_lv, by id
and by ``_name_id``) and a live record naming it second, the change can
only matter where every volume of the LV's lineage is gone: deleted, or
unmanaged.  Each path tried is kept below as a passing control, with
why it is safe; none found the wipe destroying data still needed.
"""

import dataclasses
import inspect

from oslo_db import exception as db_exc

from cinder import exception
from cinder import objects
from cinder.tests.unit import fake_constants as fake

from cinder_dmclone import evidence
from cinder_dmclone import move
from tests.harness import fake_cluster
from tests.harness.fake_cluster import LV
from tests.harness.fake_cluster import META
from tests.harness.fake_cluster import VOLUME_ID
from tests.unit import test_control_plane
from tests.unit import test_deleted_clone
from tests.unit import test_review24
from tests.unit import test_review27
from tests.unit import test_two_nodes

OTHER_ID = test_deleted_clone.OTHER_ID
THIRD_ID = fake.VOLUME3_ID


class _TwoMarks(object):
    """node-b holds move 1's clone and two DESTINATION marks naming LV."""

    _base = test_deleted_clone.DeletedCloneTestCase
    start_b = _base.start_b
    mark = _base.mark
    assert_kept = _base.assert_kept
    add_volume = _base.add_volume

    def second_mark(self, t):
        """A second mark naming LV, of volume OTHER_ID (no row).

        (The temporary volume of a generic migration moved in by Nova's
        swap, whose ``_name_id`` the migrated volume took over: see
        test_review27.TwoDeletedMarksTestCase.)
        """
        self.b.destination.evidence.record(
            dataclasses.replace(t, volume_id=OTHER_ID, secret='cd' * 16),
            evidence.DESTINATION)
        self.assertNotIn(OTHER_ID, self.c.db.volumes)

    def assert_wiped(self):
        self.assertEqual([], self.c.violations)
        self.assertEqual({}, self.b.vg.lvs)
        self.assertEqual({}, self.b.dm.devices)
        self.assertIsNone(self.b.part_marks.read(VOLUME_ID))
        self.assertIsNone(self.b.part_marks.read(OTHER_ID))
        self.assertTrue(any('/%s-dmcwipe-' % LV in p for p in self.b.wiped),
                        self.b.wiped)


class DeletedMarksTestCase(_TwoMarks, test_two_nodes.ClusterTestCase):
    """Two marks of deleted volumes naming LV, volume deleted (review 24)."""

    def setUp(self):
        super().setUp()
        self.t = test_deleted_clone.given_up_then_deleted(self)
        self.second_mark(self.t)

    # Control (refuted: "marks of deleted volumes now outvote a live
    # volume").  Nova's swap of an in-use volume: the live volume
    # THIRD_ID took the deleted temporary volume's id as its _name_id,
    # so its LV is named like both marks' moves.  Both marks' volumes
    # are gone, yet the LV stays: volume_of_lv finds the live volume
    # before any mark is looked at (recovery._named_elsewhere), and the
    # change touched only the marks' part.
    def test_control_deleted_marks_yield_to_a_live_name_id_volume(self):
        self.add_volume(THIRD_ID, _name_id=VOLUME_ID)
        self.assertEqual(LV, self.c.volume(THIRD_ID).name)
        for _ in range(2):
            self.start_b()
            self.c.now += 3600
            self.c.settle()
        self.assert_kept()
        self.assertIsNotNone(self.b.part_marks.read(OTHER_ID))

    # Control (refuted: "a database error reads as 'deleted'").  The
    # database goes away for the marks' volumes' reads of the change
    # (_volume_exists) while node-b starts: every error but
    # VolumeNotFound goes through, _drop_deleted logs it and leaves
    # everything; the next start, with the database back, wipes the LV
    # once.  (With the error on one volume only, the first drop's read
    # of the other mark's volume, VolumeNotFound, already wipes the LV:
    # also safe, as every read then says both volumes are gone.)
    def test_control_a_database_error_on_the_other_marks_volume(self):
        get = objects.Volume.get_by_id.side_effect
        fired = []

        def away(ctxt, volume_id):
            # (Only the change's reads: those of the other marks.)
            if self.database_away and any(
                    f.function == '_volume_exists' for f in inspect.stack()):
                fired.append(volume_id)
                raise db_exc.DBConnectionError('the database is away')
            return get(ctxt, volume_id)
        self.mock_object(objects.Volume, 'get_by_id', side_effect=away)
        self.database_away = True
        self.start_b()
        self.assertEqual({VOLUME_ID, OTHER_ID}, set(fired))
        self.assertEqual({LV, META}, set(self.b.vg.lvs))
        self.assertEqual([], self.b.wiped)
        self.assertIsNotNone(self.mark())
        self.assertIsNotNone(self.b.part_marks.read(OTHER_ID))
        self.log.exception.assert_called()
        self.database_away = False
        self.start_b()
        self.assert_wiped()

    # Control (refuted: "with no mark to keep it, a crash in the middle
    # of the wipe leaves the other mark's teardown removing more, or the
    # LV unwiped").  node-b dies after renaming the data LV for its wipe
    # and again after removing the metadata LV: the next start finds
    # the first mark (or only the second) and finishes; the second
    # mark's teardown, of a move whose LVs are gone, removes nothing
    # (Clones.tear_down removes only what LVM lists under its names).
    def test_control_a_crash_in_the_wipe_with_two_marks(self):
        for match in ('dmcwipe', META):
            crash = self.c.crash_at(
                self.b.vg, 'delete', when='after',
                match=lambda *a, m=match, **k: a and m in str(a[0]))
            self.assertRaises(fake_cluster.Crash, self.start_b)
            self.assertTrue(crash['fired'])
            self.mock_object(self.b.vg, 'delete',
                             side_effect=type(self.b.vg).delete.__get__(
                                 self.b.vg))
        self.start_b()
        self.c.settle()
        self.assert_wiped()
        self.start_b()
        self.assert_wiped()


class UnmanagedMarksTestCase(_TwoMarks, test_two_nodes.ClusterTestCase):
    """The two-marks case, but the volume unmanaged instead of deleted."""

    def unmanage_on_a(self):
        """Cinder's unmanage, routed to node-a (the row names it).

        As test_review27.UnmanagedCloneTestCase.unmanage_on_b: the
        driver's unmanage, then the manager's ``volume.destroy()``; the
        LV stays for the operator.
        """
        test_review27.unmanage_on(self, self.a)

    # Control (refuted: "the change wipes an unmanaged volume's data").
    # Before 84e5440 two marks of gone volumes kept node-b's clone; now
    # it goes.  Can the second volume be unmanaged rather than deleted?
    # 1. move 1 into node-b is given up while node-b is down (record
    #    ``aborted``; node-b keeps its clone and mark);
    # 2. a second mark of a gone volume on node-b names the same LV;
    # 3. the admin unmanages the volume, routed to node-a: refused
    #    (MoveInProgress) while the abort cannot reach node-b, so the
    #    row stays;
    # 4. node-b starts: the record (aborted) names it: its clone goes
    #    by DROP_ABORTED, as any given-up move; _drop_deleted never sees
    #    the LV of an unmanaged volume.  node-a's LV stays whole.
    def test_control_unmanaged_after_a_given_up_move(self):
        test_review24.AbortNeverDeliveredTestCase.given_up_while_b_is_down(
            self)
        self.second_mark(self.c.transfer())
        self.assertRaises(move.MoveInProgress, self.unmanage_on_a)
        self.assertIn(VOLUME_ID, self.c.db.volumes)
        self.start_b()
        self.c.settle()
        self.assertEqual({}, self.b.vg.lvs)
        self.assertEqual([LV], list(self.a.vg.lvs))
        self.assertTrue(self.a.vg.lvs[LV]['complete'])
        self.assertEqual([], self.a.wiped)


class UnmanagedOnTheSourceTestCase(test_control_plane.DatabaseDownTestBase):
    """An unmanage that reaches the source of a committed move."""

    commit_without_the_volume_record = (
        test_control_plane.DatabaseRestartTestCase
        .commit_without_the_volume_record)

    # Control (refuted: "an unmanage reaches the source of a committed
    # move, then node-b's start wipes the only copy of its writes").
    # 1. node-a records the commit (``hydrating``) but the database
    #    refuses the volume's new host: the row still names node-a;
    # 2. a stale whole save of the admin metadata (R14-4) removes the
    #    record; node-b dies;
    # 3. the admin unmanages the volume: routed to node-a, which holds
    #    only a SOURCE mark (never restored from: Source._restorable_here)
    #    and finds no record, so it allows it; the row goes;
    # 4. node-b starts: the row is gone, nothing names the LV: its
    #    clone (hydrated from node-a) is wiped.
    # Safe: while the row names node-a an attach on node-b is refused as
    # moving, so no instance wrote to node-b's clone; node-a's LV, whole
    # and unwiped, is the unmanaged volume.  (A committed move whose row
    # names node-b routes the unmanage there, where node-b's own mark
    # restores the record and refuses it: test_review27.)
    def test_control_unmanage_on_the_source_of_a_committed_move(self):
        stale = self.c.db.volume_admin_metadata_get(self.c.ctxt, VOLUME_ID)
        self.commit_without_the_volume_record()
        self.assertEqual(move.HYDRATING, self.c.transfer().state)
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.b)
        self.assertEqual(self.a.host, self.c.db.volumes[VOLUME_ID]['host'])
        self.c.db.volume_admin_metadata_update(
            self.c.ctxt, VOLUME_ID, dict(stale), True)
        self.assertIsNone(self.c.transfer())
        self.b.down = True
        UnmanagedMarksTestCase.unmanage_on_a(self)
        self.b.restart()
        self.b.recover()
        self.assertEqual({}, self.b.vg.lvs)
        self.assertEqual([LV], list(self.a.vg.lvs))
        self.assertTrue(self.a.vg.lvs[LV]['complete'])
        self.assertEqual([], self.a.wiped)
