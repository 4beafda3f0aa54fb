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

"""A stale save of a FIRST move's record lands during a SECOND one (R18-2).

Move 1 (``cinder migrate`` a->b) finishes; an attach on node-a moves the
volume back (move 2, b->a, hydrating on node-a from node-b's export).  A
whole save of the admin metadata read while move 1 was preparing (R14-4:
the owner's legacy ``os-attach``) then replaces move 2's record by move
1's: a->b, ``preparing``, move 1's secret, while the volume record names
node-a.  By the record node-a is the source of a stale prepare, node-b
the destination of it; by what each node holds, node-a is the
destination of move 2 and node-b its source (the only whole copy).

What a user needs: move 2 finishes (node-a's LV whole and linear, node-b's
old copy retired and wiped) or is kept as it is and reported; never is
node-b's copy removed, nor node-a's partly hydrated LV mapped linearly or
exported to a third node.  Each node's own mark of the move it takes part
in (cinder_dmclone.evidence), which no save of the admin metadata
reaches, tells it.
"""

import dataclasses

import oslo_messaging

from cinder import exception

from cinder_dmclone import evidence
from cinder_dmclone import move
from cinder_dmclone import peer
from tests.harness import fake_cluster
from tests.harness.fake_cluster import HANDLE
from tests.harness.fake_cluster import LV
from tests.harness.fake_cluster import LV_PATH
from tests.harness.fake_cluster import META
from tests.harness.fake_cluster import SECTORS
from tests.harness.fake_cluster import VOLUME_ID
from tests.unit import test_rewound_move
from tests.unit import test_rewound_window
from tests.unit import test_two_nodes

NODE_C = test_rewound_window.NODE_C


class SecondMoveMixin(test_rewound_move.RewindMixin):
    """Move 1 a->b, move 2 b->a, and the stale save of move 1's record."""

    def second_move(self):
        """Move 1 done, move 2 hydrating; returns the stale copy of move 1.

        (Not saved yet: :meth:`save_stale` does.)
        """
        stale = self.read_while_preparing()
        self.assertTrue(self.c.migrate(self.b))
        self.c.settle()
        self.c.assert_completed()
        self.c.attach(self.a)
        t = self.c.transfer()
        self.assertEqual((move.HYDRATING, 'node-b', 'node-a'),
                         (t.state, t.source_node, t.dest_node))
        self.second_secret = t.secret
        return stale

    def set_back(self):
        """Move 2 hydrating, its record replaced by move 1's."""
        stale = self.second_move()
        self.save_stale(stale)

    def save_stale(self, stale):
        self.save_whole(stale)
        t = self.c.transfer()
        self.assertEqual(('node-a', 'node-b'), (t.source_node, t.dest_node))
        self.assertNotEqual(self.second_secret, t.secret)

    def set_back_before_the_commit(self, no_move=False,
                                   abort_reaches_a=True):
        """Move 2's record replaced between node-a's answer and its commit.

        By move 1's record (``no_move``: by a copy read before any move:
        none).  node-b's commit then meets another record and gives
        move 2 up; its abort reaches node-a unless ``abort_reaches_a``
        is False (a network cut), and node-a then keeps move 2's clone.
        """
        before_any = dict(self.c.db.admin_metadata.get(VOLUME_ID, {}))
        stale = self.read_while_preparing()
        self.assertTrue(self.c.migrate(self.b))
        self.c.settle()
        self.c.assert_completed()
        if not abort_reaches_a:
            self.mock_object(self.a.destination, 'abort', side_effect=(
                oslo_messaging.MessagingTimeout('the network is cut')))
        copy = before_any if no_move else stale
        answered = self.a.destination._refuse_if_given_up
        saved = []

        def answer_then_save(volume, t):
            result = answered(volume, t)
            if not saved:
                saved.append(True)
                self.second_secret = t.secret
                self.c.db.volume_admin_metadata_update(
                    self.c.ctxt, VOLUME_ID, dict(copy, attached_mode='rw'),
                    True)
            return result
        self.mock_object(self.a.destination, '_refuse_if_given_up',
                         side_effect=answer_then_save)
        self.wiped_on_a = list(self.a.wiped)
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.a)
        self.c.attachments[:] = []
        self.assertEqual(self.b.host, self.c.db.volumes[VOLUME_ID]['host'])
        self.assertEqual(not abort_reaches_a, META in self.a.vg.lvs)

    def wiped_here_since(self, node, before):
        return any(p not in before and '/%s-dmcwipe-' % LV in p
                   for p in node.wiped)

    def assert_deleted_and_wiped(self, by_the_driver_on_b=False):
        """Every copy gone, wiped on both nodes; no mark left.

        ``by_the_driver_on_b``: no move was recorded, so node-b's LV went
        by the driver's own delete (Cinder's volume_clear, which the
        harness does not model), not by the wiper.
        """
        self.c.assert_deleted()
        if not by_the_driver_on_b:
            self.assertTrue(self.wiped_here_since(self.b, self.wiped_before),
                            self.b.wiped)
        self.assertTrue(self.wiped_here_since(self.a, self.wiped_on_a),
                        self.a.wiped)
        self.assert_no_part_marks()

    def warnings(self):
        return ' '.join(str(c) for c in self.log.warning.call_args_list)

    def assert_second_move_finished(self):
        """Move 2 done: node-a linear over its whole LV, node-b wiped."""
        self.assertEqual([], self.c.violations)
        self.assertIsNone(self.c.transfer())
        self.assertEqual(self.a.host, self.c.db.volumes[VOLUME_ID]['host'])
        self.assertEqual([LV], list(self.a.vg.lvs))
        self.assertTrue(self.a.vg.lvs[LV]['complete'])
        self.assertEqual({HANDLE: [fake_cluster.dmsetup.linear_segment(
            0, SECTORS, LV_PATH)]}, self.a.dm.devices)
        self.assertEqual({}, self.a.connector.sessions)
        self.assertEqual({}, self.b.vg.lvs)
        self.assertEqual({}, self.b.dm.devices)
        self.assertEqual({}, self.b.target.exports)
        self.assertTrue(any('/%s-dmcwipe-' % LV in p for p in self.b.wiped),
                        str(self.b.wiped))
        self.assert_no_part_marks()

    def assert_no_part_marks(self):
        for node in (self.a, self.b):
            self.assertIsNone(node.part_marks.read(VOLUME_ID), node.name)

    def assert_both_copies_kept(self):
        """Nothing of move 2 removed on either node."""
        self.assertEqual([], self.c.violations)
        self.assertIn(LV, self.b.vg.lvs)
        self.assertIn(HANDLE, self.b.dm.devices)
        self.assertIn(LV, self.a.vg.lvs)
        self.assertIn(META, self.a.vg.lvs)
        self.assertEqual([], [p for p in self.b.wiped
                              if '/%s-dmcwipe-' % LV in p
                              and p not in self.wiped_before])
        self.assertEqual(self.a.host, self.c.db.volumes[VOLUME_ID]['host'])

    def remember_wiped(self):
        self.wiped_before = list(self.b.wiped)


class SecondMoveTestCase(SecondMoveMixin, test_two_nodes.ClusterTestCase):
    """What users and operators see in that window."""

    def test_control_the_second_move_finishes_without_the_save(self):
        self.second_move()
        self.c.settle()
        self.assert_second_move_finished()

    def test_each_node_marks_the_move_it_takes_part_in(self):
        self.second_move()
        a, b = (node.part_marks.read(VOLUME_ID) for node in (self.a, self.b))
        self.assertIn('"destination"', a)
        self.assertIn('"source"', b)
        self.assertIn(self.second_secret, a)
        self.assertIn(self.second_secret, b)

    def test_the_monitor_restores_the_second_move_and_finishes_it(self):
        self.set_back()
        self.c.now += 3600
        self.a.monitor.tick()
        t = self.c.transfer()
        self.assertEqual((move.HYDRATING, 'node-b', 'node-a',
                          self.second_secret),
                         (t.state, t.source_node, t.dest_node, t.secret))
        self.assertEqual([], self.aborts_sent())
        self.c.settle()
        self.assert_second_move_finished()
        self.assertIn('is written back', self.warnings())

    def test_a_third_node_attach_is_refused_as_moving(self):
        self.set_back()
        self.c.now += 3600
        exc = self.assertRaises(
            exception.VolumeBackendAPIException, self.c.call, self.a,
            self.a.attach, self.c.volume(), dict(NODE_C))
        self.assertIn('moving from node-b to node-a', str(exc))
        self.assertEqual({}, self.a.target.exports)
        self.assertEqual([], self.aborts_sent())
        self.c.settle()
        self.assert_second_move_finished()

    def test_a_local_attach_on_the_destination_goes_on(self):
        self.set_back()
        self.c.now += 3600
        info = self.c.call(self.a, self.a.attach, self.c.volume(),
                           dict(self.a.props))
        self.assertEqual('local', info['driver_volume_type'])
        self.c.settle()
        self.assert_second_move_finished()

    def test_a_delete_removes_both_copies_wiped(self):
        self.set_back()
        self.c.now += 3600
        self.c.attachments[:] = []
        self.c.delete()
        self.c.settle(ticks=4)
        self.c.assert_deleted()
        self.assertTrue(any('/%s-dmcwipe-' % LV in p for p in self.a.wiped))
        self.assertTrue(any('/%s-dmcwipe-' % LV in p for p in self.b.wiped))
        self.assert_no_part_marks()

    def test_the_destination_restarting_restores_it(self):
        self.set_back()
        self.c.now += 3600
        self.a.restart()
        self.a.recover()
        self.assertEqual(self.second_secret, self.c.transfer().secret)
        self.assertEqual([], self.aborts_sent())
        self.c.settle()
        self.assert_second_move_finished()

    def test_the_source_restarting_keeps_its_copy(self):
        self.set_back()
        self.remember_wiped()
        self.c.now += 3600
        self.b.reboot()
        self.b.recover()
        self.assert_both_copies_kept()
        # Its export is back: node-a reads what it has not copied yet.
        self.assertIn(self.a.props['initiator'],
                      self.b.target.exports[fake_cluster.FakeTargetIQN]['acl'])
        self.assertIn('contradicts', self.warnings())
        self.c.settle()
        self.assert_second_move_finished()

    def test_both_nodes_rebooting(self):
        self.set_back()
        self.c.now += 3600
        self.b.reboot()
        self.a.reboot()
        self.b.recover()
        self.a.recover()
        self.assertEqual(self.second_secret, self.c.transfer().secret)
        self.assertNotIn('linear', [
            seg.target for seg in self.a.dm.devices.get(HANDLE, [])])
        self.c.settle(ticks=8)
        self.assert_second_move_finished()

    def test_both_nodes_rebooting_the_destination_first(self):
        self.set_back()
        self.c.now += 3600
        self.a.reboot()
        self.b.reboot()
        self.a.recover()
        self.b.recover()
        self.c.now += 120
        self.c.settle(ticks=8)
        self.assert_second_move_finished()


class SourceNeverGivesItUpTestCase(SecondMoveMixin,
                                   test_two_nodes.ClusterTestCase):
    """Neither node acts on move 1's record against its own evidence."""

    def test_node_b_keeps_its_copy_against_an_abort_of_move_1(self):
        # An abort of move 1 reaching node-b (sent by a node without
        # evidence, an older release's): refused, nothing removed.
        self.set_back()
        self.remember_wiped()
        t = self.c.transfer()
        self.assertRaises(
            exception.VolumeBackendAPIException, self.c.call, self.b,
            self.b.terminate_connection, self.c.volume(),
            dict(self.a.props, dmclone={'op': peer.ABORT,
                                        'secret': t.secret}))
        self.assert_both_copies_kept()
        self.assertIn('contradicts', self.warnings())

    def test_node_b_never_tears_down_for_move_1_at_its_start(self):
        self.set_back()
        self.remember_wiped()
        self.b.restart()
        self.b.recover()
        self.assert_both_copies_kept()

    def test_node_a_never_gives_move_1_up_while_kept(self):
        # node-a cannot roll move 2 forward (its clone lost its metadata
        # LV): its record is written back, set back to preparing, and
        # kept for an operator, as a set-back record whose clone tells
        # nothing; both copies stay.
        self.set_back()
        self.remember_wiped()
        wiped_on_a = list(self.a.wiped)
        self.a.reboot()
        self.a.vg.delete(META)
        self.a.recover()
        self.c.now += 3600
        self.assertRaises(exception.VolumeBackendAPIException, self.c.call,
                          self.a, self.a.attach, self.c.volume(),
                          dict(NODE_C))
        self.c.settle(ticks=4)
        self.assertEqual([], self.aborts_sent())
        self.assertEqual([], self.c.violations)
        self.assertIn(LV, self.b.vg.lvs)
        self.assertIn(LV, self.a.vg.lvs)
        self.assertEqual(wiped_on_a, self.a.wiped)
        self.assertNotIn(HANDLE, self.a.dm.devices)
        t = self.c.transfer()
        self.assertEqual((move.PREPARING, self.second_secret),
                         (t.state, t.secret))
        self.assertIsNotNone(
            self.c.db.volumes[VOLUME_ID]['provider_location'])


class OldMarksTestCase(SecondMoveMixin, test_two_nodes.ClusterTestCase):
    """A mark of an earlier move never stands for a later one."""

    def test_a_mark_left_by_a_finished_move_is_inert(self):
        # node-b's mark of move 1 (destination) outlived it (its removal
        # failed): the second move, and its end, ignore it.
        self.fail_removal_once(self.b)
        self.second_move()
        self.c.settle()
        self.assert_second_move_finished()

    def fail_removal_once(self, node):
        """``node``'s next removal of a mark fails (a read-only disk)."""
        fail = {'n': 0}
        remove = node.part_marks.remove

        def remove_failing_once(volume_id):
            if not fail['n']:
                fail['n'] += 1
                raise OSError('read-only file system')
            return remove(volume_id)
        self.mock_object(node.part_marks, 'remove',
                         side_effect=remove_failing_once)

    def test_a_sources_mark_left_by_a_finished_move_exports_nothing(self):
        # node-b's mark of move 2 (source) outlived its retire: at its
        # next start no record names node-b, and its mark is found, but
        # nothing of move 2 is left there to export.
        self.second_move()
        self.fail_removal_once(self.b)
        self.c.settle()
        self.assertIsNone(self.c.transfer())
        self.assertIn('"source"', self.b.part_marks.read(VOLUME_ID))
        self.b.reboot()
        self.b.recover()
        self.assertEqual({}, self.b.target.exports)
        self.assertEqual({}, self.b.dm.devices)
        self.assertEqual({}, self.b.vg.lvs)
        self.c.settle()
        self.assertEqual([LV], list(self.a.vg.lvs))

    def test_a_sources_mark_left_by_a_rollback_exports_nothing(self):
        # node-a's mark of a rolled back live migration outlived it, its
        # LV (the volume) still here, the volume record naming node-a:
        # its start exports nothing for that move.
        src, dst = self.moved(live=True)
        self.fail_removal_once(self.a)
        self.c.detach(dst)
        self.c.assert_rolled_back()
        self.c.detach(src)
        self.assertIsNotNone(self.a.part_marks.read(VOLUME_ID))
        self.a.reboot()
        self.a.recover()
        self.assertEqual({}, self.a.target.exports)

    def test_a_sources_mark_left_by_a_rollback_is_inert(self):
        # node-a's mark of a rolled back live migration outlived it, its
        # LV (the volume) still here: the volume moves again, and its
        # delete goes as usual.
        src, dst = self.moved(live=True)
        self.fail_removal_once(self.a)
        self.c.detach(dst)
        self.c.assert_rolled_back()
        self.assertIsNotNone(self.a.part_marks.read(VOLUME_ID))
        self.c.detach(src)
        self.c.delete()
        self.c.assert_deleted()

    def test_a_crash_between_the_mark_and_the_build(self):
        # node-b dies right after it marked move 1: the source gives the
        # move up, node-b's start finds nothing built, and the next
        # move goes ahead.
        self.c.crash_at(self.b.dest, 'create_volumes')
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.migrate, self.b)
        self.c.settle()
        self.c.assert_rolled_back(aborted_ok=True)
        self.assertTrue(self.c.migrate(self.b))
        self.c.settle()
        self.c.assert_completed()

    def test_a_record_without_secret_moves_as_before(self):
        t = self.saved()
        self.c.db.admin_metadata[VOLUME_ID].pop('dmclone_secret')
        self.assertEqual('', self.c.transfer().secret)
        self.a.restart()
        self.a.recover()
        self.c.assert_rolled_back(aborted_ok=True)
        self.assertEqual('node-b', t.dest_node)

    def test_a_crash_between_the_sources_mark_and_the_prepare(self):
        # node-a dies right after it marked the move it starts: its start
        # gives the move up (its mark names that very move), and the
        # next move goes ahead.
        self.c.crash_at(self.a.peer, 'prepare')
        self.assertRaises(oslo_messaging.MessagingTimeout,
                          self.c.migrate, self.b)
        self.c.settle()
        self.c.assert_rolled_back(aborted_ok=True)
        self.assertIsNone(self.a.part_marks.read(VOLUME_ID))
        self.assertTrue(self.c.migrate(self.b))
        self.c.settle()
        self.c.assert_completed()


class NoMoveSavedTestCase(SecondMoveMixin, test_two_nodes.ClusterTestCase):
    """The copy saved was read before any move: it holds no move at all.

    Saved during move 2 it removes move 2's record: node-a's mark alone
    still says a move goes on.
    """

    def set_back(self):
        stale = dict(self.c.db.admin_metadata.get(VOLUME_ID, {}))
        self.second_move()
        self.c.db.volume_admin_metadata_update(
            self.c.ctxt, VOLUME_ID, dict(stale, attached_mode='rw'), True)
        self.assertIsNone(self.c.transfer())

    def test_the_monitor_writes_it_back(self):
        self.set_back()
        self.a.monitor.tick()
        self.assertEqual(self.second_secret, self.c.transfer().secret)
        self.c.settle()
        self.assert_second_move_finished()

    def test_a_reboot_of_the_destination_writes_it_back(self):
        self.set_back()
        self.a.reboot()
        self.a.recover()
        self.assertEqual(self.second_secret, self.c.transfer().secret)
        self.c.settle(ticks=8)
        self.assert_second_move_finished()

    def test_a_reboot_of_the_source_exports_it_again(self):
        # node-b's start finds move 2 by its own mark alone (no record
        # names node-b): its export is back, and move 2 finishes.
        self.set_back()
        self.b.reboot()
        self.b.recover()
        self.assertIn(self.a.props['initiator'],
                      self.b.target.exports[fake_cluster.FakeTargetIQN]['acl'])
        self.assertIn('is made again', self.warnings())
        self.c.settle()
        self.assert_second_move_finished()

    def test_both_nodes_rebooting_the_source_first(self):
        self.set_back()
        self.b.reboot()
        self.a.reboot()
        self.b.recover()
        self.a.recover()
        self.assertEqual(self.second_secret, self.c.transfer().secret)
        self.c.settle(ticks=8)
        self.assert_second_move_finished()

    def test_no_export_once_the_volume_reads_no_copy_there(self):
        # The volume record no longer names node-b's export (as once a
        # finalization forgot it): node-b's mark is no reason to export.
        self.set_back()
        self.c.db.volumes[VOLUME_ID]['provider_location'] = None
        self.b.reboot()
        self.b.recover()
        self.assertEqual({}, self.b.target.exports)
        self.assertIn(LV, self.b.vg.lvs)

    def test_a_third_node_never_gets_the_clone(self):
        self.set_back()
        self.assertRaises(exception.VolumeBackendAPIException, self.c.call,
                          self.a, self.a.attach, self.c.volume(),
                          dict(NODE_C))
        self.assertEqual({}, self.a.target.exports)
        self.c.settle()
        self.assert_second_move_finished()


class EvidenceTestCase(test_two_nodes.ClusterTestCase):
    """The marks themselves: what they hold, and when one is evidence."""

    def part(self):
        return self.b.destination.evidence

    def test_a_mark_round_trips_the_whole_record(self):
        t = self.saved()
        text = evidence.encode(evidence.DESTINATION, t, 'node-a iqn.x:i')
        part = evidence.decode(VOLUME_ID, text)
        self.assertEqual((evidence.DESTINATION, 'node-a iqn.x:i'),
                         (part.role, part.export))
        self.assertEqual(t.to_metadata(), part.move.to_metadata())

    def test_garbage_is_no_evidence(self):
        t = self.saved()
        for text in ('', '{', '[]', '{"role": "source"}',
                     '{"role": "judge", "record": {}}',
                     evidence.encode(evidence.SOURCE, t).replace(
                         t.secret, 'not-hex')):
            self.assertRaises(evidence.PartMarkInvalid, evidence.decode,
                              VOLUME_ID, text)
            self.b.part_marks.write(VOLUME_ID, text or ' ')
            self.assertIsNone(self.part().read(VOLUME_ID))

    def test_a_move_without_secret_is_never_marked(self):
        t = self.saved()
        t.secret = ''
        self.assertRaises(evidence.PartMarkInvalid, evidence.encode,
                          evidence.SOURCE, t)

    def test_another_nodes_role_is_no_evidence(self):
        # (A mark naming node-a as the destination, on node-b.)
        t = self.saved()
        self.b.part_marks.write(VOLUME_ID, evidence.encode(
            evidence.SOURCE, t))
        self.assertIsNone(self.part().read(VOLUME_ID))

    def test_forget_removes_only_its_own_move(self):
        t = self.saved()
        self.part().record(t, evidence.DESTINATION)
        later = dataclasses.replace(t, secret='ab' * 16)
        self.part().forget(VOLUME_ID, later)
        self.assertIsNotNone(self.part().read(VOLUME_ID))
        self.part().forget(VOLUME_ID, t)
        self.assertIsNone(self.part().read(VOLUME_ID))

    def test_a_mark_that_cannot_be_written_refuses_the_part(self):
        self.mock_object(self.b.part_marks, 'write',
                         side_effect=OSError('read-only file system'))
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.c.attach, self.b)
        self.c.settle()
        self.c.assert_rolled_back(aborted_ok=True)

    def test_a_mark_whose_move_left_nothing_is_no_contradiction(self):
        t = self.saved()
        self.part().record(t, evidence.DESTINATION)
        self.assertIsNone(self.part().contradiction(VOLUME_ID, None))

    def test_an_unlisted_volume_group_keeps_the_evidence(self):
        t = self.saved()
        self.part().record(t, evidence.DESTINATION)
        self.b.vg_unlisted = True
        self.assertEqual(t.secret, self.part().contradiction(
            VOLUME_ID, None).move.secret)
        self.assertIsNone(self.part().contradiction(VOLUME_ID, t))


class UncommittedSetBackTestCase(SecondMoveMixin,
                                 test_two_nodes.ClusterTestCase):
    """Move 2's record replaced before its commit (review 21, finding 1).

    node-b gives move 2 up: node-a takes its abort by its own mark's
    secret and drops the clone it built (never handed to an instance);
    a delete of the volume, in any window, removes every copy, wiped.
    """

    def delete(self):
        self.remember_wiped()
        self.c.delete()
        self.c.settle()

    def test_the_abort_is_taken_by_the_marks_secret(self):
        self.set_back_before_the_commit()
        self.assertEqual({}, self.a.vg.lvs)
        self.assertEqual({}, self.a.connector.sessions)
        self.assertTrue(self.wiped_here_since(self.a, self.wiped_on_a))
        self.assertIsNone(self.a.part_marks.read(VOLUME_ID))
        self.assertIn('removing what was built here for it',
                      self.warnings())
        # node-b's copy stays the volume.
        self.c.now += 3600
        self.c.settle()
        self.assertTrue(self.b.vg.lvs[LV]['complete'])
        self.assertEqual([], self.c.violations)

    def test_the_abort_is_taken_without_any_record(self):
        self.set_back_before_the_commit(no_move=True)
        self.assertIsNone(self.c.transfer())
        self.assertEqual({}, self.a.vg.lvs)
        self.assertIsNone(self.a.part_marks.read(VOLUME_ID))

    def send_abort(self, secret):
        return self.c.call(self.a, self.a.terminate_connection,
                           self.c.volume(), dict(self.b.props, dmclone={
                               'op': peer.ABORT, 'secret': secret}))

    def assert_a_keeps_move_2(self):
        self.assertIn(LV, self.a.vg.lvs)
        self.assertIn(META, self.a.vg.lvs)
        self.assertIn(self.second_secret, self.a.part_marks.read(VOLUME_ID))

    def test_an_abort_with_a_wrong_secret_is_refused(self):
        self.set_back_before_the_commit(abort_reaches_a=False)
        exc = self.assertRaises(exception.VolumeBackendAPIException,
                                self.send_abort, 'cd' * 16)
        self.assertIn("does not carry the transfer's secret", str(exc))
        self.assert_a_keeps_move_2()

    def test_an_abort_with_an_old_secret_is_refused(self):
        # Move 1's secret: the record's, but node-a is not move 1's
        # destination; and with no record, neither the record's nor the
        # mark's.
        self.set_back_before_the_commit(abort_reaches_a=False)
        first = self.c.transfer().secret
        self.mock_object(self.a.destination, 'abort',
                         side_effect=self.a.destination.abort)
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.send_abort, first)
        self.c.db.admin_metadata[VOLUME_ID] = {}
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.send_abort, first)
        self.assert_a_keeps_move_2()

    def test_delete_with_the_abort_lost(self):
        self.set_back_before_the_commit(abort_reaches_a=False)
        self.delete()
        self.assert_deleted_and_wiped()

    def test_delete_after_the_abort(self):
        self.set_back_before_the_commit()
        self.delete()
        self.assert_deleted_and_wiped()

    def test_delete_after_the_abort_without_any_record(self):
        self.set_back_before_the_commit(no_move=True)
        self.delete()
        self.assert_deleted_and_wiped(by_the_driver_on_b=True)

    def test_delete_with_a_mark_left_on_the_owner(self):
        # node-b's mark of move 2 (source) outlived its give-up.
        remove = self.b.part_marks.remove
        self.mock_object(self.b.part_marks, 'remove',
                         side_effect=[OSError('read-only file system'),
                                      remove, remove, remove])
        self.set_back_before_the_commit(abort_reaches_a=False)
        self.assertIn('"source"', self.b.part_marks.read(VOLUME_ID))
        self.mock_object(self.b.part_marks, 'remove', side_effect=remove)
        self.delete()
        self.assert_deleted_and_wiped()

    def test_delete_after_an_hour_with_the_abort_lost(self):
        self.set_back_before_the_commit(abort_reaches_a=False)
        self.c.now += 3600
        self.c.settle()
        self.assertIn(LV, self.b.vg.lvs)
        self.delete()
        self.assert_deleted_and_wiped()


class CommittedSetBackDeleteTestCase(SecondMoveMixin,
                                     test_two_nodes.ClusterTestCase):
    """A delete of a committed move 2 whose record a stale save replaced."""

    def test_an_abort_of_the_committed_move_is_refused(self):
        self.set_back()
        self.remember_wiped()
        exc = self.assertRaises(
            exception.VolumeBackendAPIException, self.c.call, self.a,
            self.a.terminate_connection, self.c.volume(),
            dict(self.b.props, dmclone={'op': peer.ABORT,
                                        'secret': self.second_secret}))
        self.assertIn('committed', str(exc))
        self.assert_both_copies_kept()

    def delete_and_check(self):
        self.remember_wiped()
        self.wiped_on_a = list(self.a.wiped)
        self.c.attachments[:] = []
        self.c.delete()
        self.c.settle()
        self.assert_deleted_and_wiped()

    def test_by_move_1s_record(self):
        self.set_back()
        self.delete_and_check()

    def test_without_any_record(self):
        NoMoveSavedTestCase.set_back(self)
        self.delete_and_check()

    def test_without_any_record_after_the_source_rebooted(self):
        NoMoveSavedTestCase.set_back(self)
        self.b.reboot()
        self.b.recover()
        self.delete_and_check()
