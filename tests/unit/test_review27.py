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

"""Review 27: the start-up wipe of a deleted volume's clone (r24-2).

Recovery._drop_deleted takes VolumeNotFound for "deleted".  Cinder's
unmanage also removes the row (``volume.destroy()`` after the driver's
unmanage), and it keeps the LV for the operator on purpose: tried, and
closed by the driver (the record is restored from the mark first).
"""

import dataclasses

from cinder_dmclone import evidence
from cinder_dmclone import move
from tests.harness import fake_cluster
from tests.harness.fake_cluster import LV
from tests.harness.fake_cluster import META
from tests.harness.fake_cluster import VOLUME_ID
from tests.unit import test_deleted_clone
from tests.unit import test_two_nodes


def unmanage_on(test, node):
    """Cinder's unmanage of the volume, routed to ``node``.

    The driver's unmanage (give_up_aborted, before_unmanage, then the
    handle goes), then the manager's ``volume.destroy()``.
    """
    volume = test.volume()
    node.source.give_up_aborted(volume)
    node.destination.before_unmanage(volume)
    node.dm.remove(fake_cluster.HANDLE)
    del test.c.db.volumes[VOLUME_ID]
    test.c.db.admin_metadata.pop(VOLUME_ID, None)


class UnmanagedCloneTestCase(test_two_nodes.ClusterTestCase):
    """An unmanaged volume's LV on node-b, wiped by node-b's next start."""

    def unmanage_on_b(self):
        """Cinder's unmanage of the volume, routed to node-b (its host).

        The driver's unmanage (give_up_aborted, before_unmanage, then the
        handle goes), then the manager's ``volume.destroy()``: the row is
        gone, the LVs stay for the operator (to manage them again).
        """
        unmanage_on(self, self.b)

    def moved_then_record_lost(self):
        """A committed move to node-b whose record a stale save removed.

        R14-4: a copy of the admin metadata read before the move (no
        move in it) saved whole over the record while the volume record
        names node-b (the very case _export_marked_elsewhere's own
        docstring describes).  node-b's mark of the move stays.
        """
        stale = self.c.db.volume_admin_metadata_get(self.c.ctxt, VOLUME_ID)
        self.moved()
        self.assertEqual(move.HYDRATING, self.c.transfer().state)
        self.assertEqual(self.b.host, self.c.db.volumes[VOLUME_ID]['host'])
        self.c.db.volume_admin_metadata_update(
            self.c.ctxt, VOLUME_ID, dict(stale, attached_mode='rw'), True)
        self.assertIsNone(self.c.transfer())
        self.assertIsNotNone(self.b.part_marks.read(VOLUME_ID))

    # Control: with its record, the unmanage is refused while the volume
    # hydrates (before_unmanage).
    def test_control_unmanage_refused_while_recorded(self):
        self.moved()
        self.assertRaises(move.MoveInProgress, self.unmanage_on_b)
        self.assertIn(VOLUME_ID, self.c.db.volumes)

    # Tried (refuted): unmanage after a stale save removed the record.
    # The driver's unmanage first runs give_up_aborted, whose
    # end_stale_prepare (source.py:1108) restores the record from
    # node-b's own mark: before_unmanage then refuses, the row stays, so
    # no start ever takes the unmanaged LV for a deleted volume's.
    def test_control_unmanage_after_a_stale_save_is_refused(self):
        self.moved_then_record_lost()
        self.assertRaises(move.MoveInProgress, self.unmanage_on_b)
        self.assertEqual(move.HYDRATING, self.c.transfer().state)
        self.assertIn(VOLUME_ID, self.c.db.volumes)
        self.assertEqual({LV, META}, set(self.b.vg.lvs))


class TwoDeletedMarksTestCase(test_two_nodes.ClusterTestCase):
    """Two marks of deleted volumes naming one LV: the LV is wiped."""

    def setUp(self):
        super().setUp()
        # (test_deleted_clone's arrangement: move 1 given up while node-b
        # was down, then the volume deleted; node-b holds its clone.)
        self.t = test_deleted_clone.given_up_then_deleted(self)

    _base = test_deleted_clone.DeletedCloneTestCase
    start_b = _base.start_b
    mark = _base.mark
    assert_kept = _base.assert_kept
    add_volume = _base.add_volume

    # Finding 2 (LOW: a deleted tenant's data never wiped).
    # 1. node-b holds two DESTINATION marks naming the same LV (e.g. the
    #    temporary volume of a generic migration moved in by Nova's swap,
    #    whose _name_id the migrated volume took over, and a later move
    #    of that volume back into node-b; or a mark a failed removal left);
    # 2. both volumes are deleted while node-b is down;
    # 3. every start: _drop_deleted of each finds the other's mark in
    #    _named_elsewhere (recovery.py:561-565) -> KEEP_NAMED; neither
    #    mark ever goes, the clone of a deleted volume is never wiped
    #    (only warned about).  No live volume or record is involved: a
    #    mark of a deleted volume should not count as "named elsewhere".
    # Fixed: another mark keeps the LV only while its volume exists.
    def test_two_marks_of_deleted_volumes_are_wiped(self):
        self.b.destination.evidence.record(
            dataclasses.replace(self.t, volume_id=test_deleted_clone.OTHER_ID,
                                secret='cd' * 16), evidence.DESTINATION)
        self.assertNotIn(test_deleted_clone.OTHER_ID, self.c.db.volumes)
        for _ in range(3):
            self.start_b()
            self.c.now += 3600
            self.c.settle()
        self.assertEqual({}, self.b.vg.lvs)
        self.assertTrue(any('/%s-dmcwipe-' % LV in p for p in self.b.wiped),
                        self.b.wiped)
