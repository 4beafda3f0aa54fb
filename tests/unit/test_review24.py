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

"""Review 24 (branch r18-2-merged, a28c432): marks left by a move's end.

The reviewer's tests, not fixes.  Each ``expectedFailure`` shows a
sequence the branch gets wrong today (each was run without its
decorator and fails on the assertion its comment names).

Looked at without a finding within the review's time: a generic
migration's delete of its temporary volume (its admin metadata is the
original's, swapped by finish_volume_migration; Destination.delete needs
is_dest or a DESTINATION mark of that id, and _remove_built keeps a data
LV without metadata for ``aborted``/``preparing``); drop_for_delete
(runs only with DELETING and a ``deleting`` row, removes only the
mark's LV of the volume being deleted); the thin-map guard after a
restore (was_mapped reads the node's map mark by secret, so the
restored record's thin_mapped=False does not drop the guard); end marks
vs moving marks in _swapped/_emptied (both need the same secret).
"""

import oslo_messaging

from cinder import exception

from cinder_dmclone import move
from tests.harness.fake_cluster import LV
from tests.harness.fake_cluster import VOLUME_ID
from tests.unit import test_rewound_move
from tests.unit import test_two_nodes


class LostReleaseTestCase(test_two_nodes.ClusterTestCase):
    """A rollback whose RELEASE to the source is lost leaves its mark."""

    def rolled_back_release_lost(self):
        """Move 1 (live a->b) rolled back; its RELEASE never reaches a.

        Destination.rollback logs the failure as "harmless and goes with
        the next detach there"; Source.release, which alone removes
        node-a's SOURCE mark of move 1 (end_part), never runs.
        """
        src, dst = self.moved(live=True)
        first = self.c.transfer().secret
        self.mock_object(self.a.source, 'release', side_effect=(
            oslo_messaging.MessagingTimeout('the network is cut')))
        self.c.detach(dst)
        self.c.detach(src)
        self.assertIsNone(self.c.transfer())
        self.assertEqual(self.a.host, self.c.db.volumes[VOLUME_ID]['host'])
        return first

    # Control: the mark left is the rolled-back move's, and it is live
    # by Evidence.live (node-a's LV is there, no record names it an old
    # copy): every later record of the volume is "contradicted" on
    # node-a until a new move from node-a overwrites the mark.  A plain
    # later move a->b still works (its _mark_part overwrites it).
    def test_control_the_release_lost_leaves_a_live_source_mark(self):
        first = self.rolled_back_release_lost()
        self.assertIn(first, self.a.part_marks.read(VOLUME_ID))
        self.assertIsNotNone(self.a.source.contradiction(VOLUME_ID, None))
        self.c.attach(self.b)
        self.c.settle()
        self.c.assert_completed()

    # Finding 1 (MEDIUM: a volume stuck "moving" for ever, manual repair).
    # 1. move 1 a->b (live migration) is rolled back by node-b; its
    #    RELEASE to node-a is lost: node-a keeps its SOURCE mark of
    #    move 1 (live: the volume's LV is on node-a);
    # 2. an attach on node-b starts move 2: node-a records it
    #    (Store.save) and dies before Source._mark_part (source.py:271);
    # 3. node-a restarts: Recovery.run finds move 2's record
    #    contradicted by move 1's mark (recovery.py:695), cannot restore
    #    (a source mark) and keeps it: KEEP_CONTRADICTED;
    # 4. every later attach elsewhere, and the stale-prepare give-up
    #    (Source.give_up, source.py ~1278 refuse_if_contradicted), is
    #    refused for ever: the volume cannot move or be attached on
    #    another node until an operator edits files under state_path,
    #    although move 2 never built anything.  DESIGN: "a node that
    #    reboots in the middle of a move to need no manual repair".
    # (Fixed: a record of a later move from node-a, by node-a's own
    # clock, is not contradicted by its older source mark:
    # evidence.superseded.)
    def test_a_crash_before_the_mark_after_a_lost_release(self):
        self.rolled_back_release_lost()
        # (A later attach is a later second by node-a's clock; within the
        # same second the two moves are not told apart, and the record
        # stays contradicted: evidence.superseded.)
        self.c.now += 60
        self.mock_object(self.a.source, 'release', side_effect=None)
        self.c.crash_at(self.a.source, '_mark_part')
        self.assertRaises(oslo_messaging.MessagingTimeout,
                          self.c.attach, self.b)
        self.c.attachments[:] = []
        # node-a's restart gave the dead prepare up, as without the old
        # mark (before the fix: kept, contradicted, for ever).
        self.assertIsNone(self.c.transfer())
        self.assertEqual([], self.c.violations)
        # Long after move 2's deadline: a dead prepare, given up by any
        # later attach (as without the old mark).
        self.c.now += 3600
        self.c.settle()
        self.c.attach(self.b)
        self.c.settle()
        self.c.assert_completed()


class AbortNeverDeliveredTestCase(test_two_nodes.ClusterTestCase):
    """A move given up while its destination is down, then a delete."""

    def given_up_while_b_is_down(self):
        """Node-b built move 1's clone and died before answering.

        node-a's attempt times out and gives the move up; its abort
        cannot reach node-b: the record stays ``aborted`` (Source.give_up)
        "for its recovery to clean up".  node-b keeps its mark of move 1
        (its part never ended) and a half-built clone: regions of the
        tenant's data copied into its data LV.
        """
        self.c.restart_before_timeout = False
        self.c.crash_at(self.b.destination, '_refuse_if_given_up',
                        when='after')
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.b)
        self.c.attachments[:] = []
        self.assertTrue(self.b.down)
        self.assertEqual(move.ABORTED, self.c.transfer().state)
        self.assertIn(LV, self.b.vg.lvs)

    def destroy(self):
        """Cinder's delete finished: the volume's row is gone."""
        self.c.delete()
        del self.c.db.volumes[VOLUME_ID]
        self.c.db.admin_metadata.pop(VOLUME_ID, None)

    # Control: node-b back BEFORE the delete: its recovery removes its
    # side, wiped (the aborted record tells it).
    def test_control_back_before_the_delete(self):
        self.given_up_while_b_is_down()
        self.c.restart(self.b)
        self.c.settle()
        self.assertEqual({}, self.b.vg.lvs)
        self.destroy()
        self.assertEqual({}, self.a.vg.lvs)

    # Finding 2 (MEDIUM: a deleted tenant's data never wiped).
    # 1. an attach on node-b starts move 1; node-b builds its clone
    #    (regions copied) and dies before answering;
    # 2. node-a gives the move up, its abort cannot reach node-b: record
    #    ``aborted`` (source.py give_up), node-b's mark of move 1 stays;
    # 3. the owner deletes the volume on node-a: give_up_aborted's abort
    #    fails again, the delete goes on, the row and its admin metadata
    #    (the aborted record) are gone;
    # 4. node-b restarts: no record names it (volumes_touching), the
    #    metadata LV "matches no transfer", the mark's volume is not
    #    found (recovery._export_marked_elsewhere: "inert"): the
    #    half-built clone of the deleted volume stays, unwiped, for ever
    #    (only reported).  node-b's own mark says exactly what it is, a
    #    destination of a move never committed (the row never named
    #    node-b), yet nothing acts on it; R18-2's drop_for_delete only
    #    runs on the node a delete's retire reaches.
    # (Fixed: node-b's start tears down, wiped, the clone its mark names
    # when the mark's volume is not found and nothing else names its LV:
    # Recovery._drop_deleted; its safety controls in
    # test_deleted_clone.)
    def test_the_delete_while_b_is_down_leaves_its_clone(self):
        self.given_up_while_b_is_down()
        self.destroy()
        self.assertEqual({}, self.a.vg.lvs)
        self.b.restart()
        self.b.recover()
        self.c.now += 3600
        self.c.settle(ticks=8)
        self.assertEqual({}, self.b.vg.lvs)
        self.assertTrue(any('/%s-dmcwipe-' % LV in p for p in self.b.wiped),
                        self.b.wiped)


class SameSourceMixin(test_rewound_move.RewindMixin):
    """Two moves a->b, the first's record saved back over the second's."""

    def set_back_from_the_same_source(self, seconds):
        """Move 1 rolled back; move 2 ``seconds`` later by node-a's clock.

        A save of a copy read during move 1's prepare then puts move 1's
        record over move 2's.  Returns (move 1, move 2).
        """
        stale = self.read_while_preparing()
        src, dst = self.moved(live=True)            # move 1 a->b
        first = self.c.transfer()
        self.c.detach(dst)
        self.c.detach(src)                          # rolled back
        self.assertIsNone(self.c.transfer())
        self.c.now += seconds
        self.c.attach(self.b)                       # move 2 a->b
        second = self.c.transfer()
        self.assertEqual(move.HYDRATING, second.state)
        self.save_whole(stale)
        self.assertEqual(first.secret, self.c.transfer().secret)
        return first, second


class SameSourceStaleSaveTestCase(SameSourceMixin,
                                  test_two_nodes.ClusterTestCase):
    """Finding 1's fix keeps R18-2's protection for one source's moves.

    (evidence.superseded: a later record over an older source mark is
    not a contradiction; an earlier record over a later mark still is.)
    """

    def test_an_earlier_record_of_the_same_source_stays_contradicted(self):
        first, second = self.set_back_from_the_same_source(60)
        # move 1's record, earlier by node-a's own clock, over move 2's
        self.assertGreater(second.prepared_at, first.prepared_at)
        part = self.a.source.contradiction(VOLUME_ID, self.c.transfer())
        self.assertIsNotNone(part)
        self.assertEqual(second.secret, part.move.secret)
        self.c.settle()
        self.c.assert_completed()
        self.assertEqual(self.b.host, self.c.db.volumes[VOLUME_ID]['host'])
