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

"""Review 21 (branch r18-2, 7f0ce21): findings as expected failures.

R18-2's node-local marks of the move each node takes part in
(cinder_dmclone.evidence): a mark whose move still has data on its node
stops every destructive step on a record it contradicts, and only the
destination of a committed move writes its record back.  Each test below
is a sequence where that leaves a volume undeletable with a tenant's copy
never wiped, or a move unable to read its source.  They are the
reviewer's, not fixes.
"""

import oslo_messaging

from cinder import exception

from tests.harness import fake_cluster
from tests.harness.fake_cluster import LV
from tests.harness.fake_cluster import META
from tests.harness.fake_cluster import VOLUME_ID
from tests.unit import test_stale_first_move
from tests.unit import test_two_nodes

IQN = fake_cluster.FakeTargetIQN


class StaleSaveBeforeTheCommitTestCase(test_stale_first_move.SecondMoveMixin,
                                       test_two_nodes.ClusterTestCase):
    """The stale save of move 1 lands while move 2 is not committed yet.

    Move 1 (a->b) done; an attach on node-a starts move 2 (b->a).  Node-a
    marks move 2 and builds its clone (hydrating: its partial copy of the
    volume); the owner's stale save of move 1's record lands after
    node-a answered and before node-b records the commit.  node-b's
    commit meets another move (MoveStateConflict) and gives up move 2:
    its abort to node-a is ignored there (the record names move 1), so
    node-a keeps move 2's clone, metadata LV, session and mark; the
    volume record names node-b, the record move 1 (a->b, preparing).
    """

    def stale_save_before_the_commit(self, abort_reaches_a=False):
        """The window above; node-a keeps move 2 unless its abort reaches it.

        (Fixed since the review: node-a takes move 2's abort by its mark,
        test_the_abort_drops_the_uncommitted_clone.  Without
        ``abort_reaches_a`` the abort is lost on its way, a network cut,
        which leaves node-a as the review found it.)
        """
        if not abort_reaches_a:
            self.mock_object(self.a.destination, 'abort', side_effect=(
                oslo_messaging.MessagingTimeout('the network is cut')))
        stale = self.read_while_preparing()
        self.assertTrue(self.c.migrate(self.b))
        self.c.settle()
        self.c.assert_completed()
        answered = self.a.destination._refuse_if_given_up
        saved = []

        def answer_then_save(volume, t):
            result = answered(volume, t)
            if not saved:
                saved.append(True)
                self.c.db.volume_admin_metadata_update(
                    self.c.ctxt, VOLUME_ID, dict(stale, attached_mode='rw'),
                    True)
            return result
        self.mock_object(self.a.destination, '_refuse_if_given_up',
                         side_effect=answer_then_save)
        self.wiped_on_a = list(self.a.wiped)
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.a)
        self.c.now += 3600
        self.c.settle()
        t = self.c.transfer()
        self.assertEqual(('node-a', 'node-b'), (t.source_node, t.dest_node))
        self.assertEqual(self.b.host, self.c.db.volumes[VOLUME_ID]['host'])
        if abort_reaches_a:
            return
        # node-a: move 2's partial copy, and its mark of it.
        self.assertIn(LV, self.a.vg.lvs)
        self.assertIn(META, self.a.vg.lvs)
        self.assertIn('"destination"', self.a.part_marks.read(VOLUME_ID))

    # MEDIUM (denial of service, and a tenant's copy never wiped).
    # Sequence: above; then the user deletes the volume (its owner may).
    # node-b (the destination of move 1 by the record, which names it)
    # tears its LV down -- the volume's only whole copy, rightly, it is
    # a delete -- and sends RETIRE of move 1 to node-a.  Source.retire
    # (source.py:1748) refuses it: node-a's mark of move 2 contradicts
    # move 1's record and its clone is "live" (metadata LV,
    # evidence.py:247).  node-a cannot restore move 2 either: never
    # committed, the volume record names node-b
    # (Destination._unrestorable, destination.py:1932).  So every delete
    # fails (error_deleting) for good, and node-a keeps the part of the
    # tenant's volume it hydrated, never wiped, with an iSCSI session
    # to node-b.  Before R18-2 (1e04934) the same delete succeeded and
    # node-a's LV was wiped.  Neither mark here protects data: node-a's
    # clone was never handed to an instance (move 2 never committed).
    # Fixed: node-b's delete tells node-a it is a delete (peer.DELETING);
    # node-a then removes, wiped, what its mark names too
    # (Destination.drop_for_delete) and retires its copy whatever its
    # mark says (Source.retire).
    def test_the_volume_can_be_deleted(self):
        self.stale_save_before_the_commit()
        wiped_on_a = list(self.a.wiped)
        self.c.attachments[:] = []
        try:
            self.c.delete()
        except Exception as exc:
            self.fail('the delete failed: %s' % exc)
        self.c.settle()
        self.assertNotIn(LV, self.a.vg.lvs)
        self.assertTrue(any(p not in wiped_on_a and '/%s-dmcwipe-' % LV in p
                            for p in self.a.wiped), self.a.wiped)

    # Fixed too: node-b's give-up of move 2 reaches node-a, which takes
    # the abort by its mark's secret (Side.authenticate) and drops the
    # clone it built for move 2, wiped (Destination._abort_marked).
    def test_the_abort_drops_the_uncommitted_clone(self):
        self.stale_save_before_the_commit(abort_reaches_a=True)
        self.assertEqual([], self.c.violations)
        self.assertEqual({}, self.a.vg.lvs)
        self.assertEqual({}, self.a.dm.devices)
        self.assertEqual({}, self.a.connector.sessions)
        self.assertIsNone(self.a.part_marks.read(VOLUME_ID))
        self.assertTrue(any(p not in self.wiped_on_a
                            and '/%s-dmcwipe-' % LV in p
                            for p in self.a.wiped), self.a.wiped)
        self.assertIn(LV, self.b.vg.lvs)
        self.assertTrue(self.b.vg.lvs[LV]['complete'])

    # Control: nothing is removed before the delete (node-b keeps the
    # volume's only whole copy; the record's move 1 is not acted on).
    # (node-a's abort lost: see stale_save_before_the_commit.)
    def test_control_both_copies_stay_until_the_delete(self):
        self.stale_save_before_the_commit()
        self.assertEqual([], self.c.violations)
        self.assertIn(LV, self.b.vg.lvs)
        self.assertTrue(self.b.vg.lvs[LV]['complete'])


class SourceRebootWithoutRecordTestCase(
        test_stale_first_move.SecondMoveMixin, test_two_nodes.ClusterTestCase):
    """The copy saved held no move, and move 2's source reboots.

    Move 2 (b->a) hydrating on node-a from node-b's export; a copy of the
    admin metadata read before any move is saved whole: no record at all
    (NoMoveSavedTestCase).  node-b reboots then: its LIO targets go.
    """

    set_back = test_stale_first_move.NoMoveSavedTestCase.set_back

    # MEDIUM (availability: reads of regions not yet copied fail, and
    # hydration stalls, until node-b restarts once more).  Sequence:
    # above; node-b's start recovers only the volumes whose record names
    # it (Recovery.recover over recovery.volumes_touching): with no
    # record and the volume record naming node-a, move 2 is not among
    # them, and node-b's own mark (source of move 2) is never read
    # (Recovery._restored_at_start, recovery.py:390, looks for a
    # destination's mark only; _contradicted, which exports again, runs
    # only for a record).  node-a's monitor then writes move 2's record
    # back (hydrating), but nothing on node-b exports its copy again:
    # node-a's clone reads every region it has not copied from a target
    # that no longer exists.  With move 1's record saved instead
    # (test_stale_first_move test_the_source_restarting_keeps_its_copy)
    # node-b's start does export it again.
    # Fixed: node-b's start also reads its own marks of the volumes no
    # record led it to (Recovery._export_marked_elsewhere) and exports
    # again the copy a committed move still reads
    # (Source.export_by_mark).
    def test_the_sources_export_comes_back(self):
        self.set_back()
        self.b.reboot()
        self.b.recover()
        for _tick in range(3):
            self.c.now += 30
            self.a.monitor.tick()
            self.b.monitor.tick()
        self.assertEqual(self.second_secret, self.c.transfer().secret)
        self.assertIn(self.a.props['initiator'],
                      self.b.target.exports.get(IQN, {}).get('acl', ()))

    # Control: without node-b's reboot its export stays.
    def test_control_the_export_stays_without_a_reboot(self):
        self.set_back()
        self.a.monitor.tick()
        self.assertIn(self.a.props['initiator'],
                      self.b.target.exports[IQN]['acl'])
