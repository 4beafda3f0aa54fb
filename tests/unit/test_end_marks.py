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

"""The end marks of a move into a node, and the set-back moves they end.

A rollback marks its move before its teardown, a finalization before
its swap to linear (Destination.mark_end).  A move set back to
``preparing`` by a stale save is ended from such a mark only with the
rest of the evidence (Destination._emptied, Destination._swapped); a
crash or a reboot between a mark and its step, a mark that is missing,
unreadable or another's, and an LVM that cannot list the group keep
the move instead.
"""

import oslo_messaging

from cinder_dmclone import move
from tests.harness import fake_cluster
from tests.harness.fake_cluster import HANDLE
from tests.harness.fake_cluster import LV
from tests.harness.fake_cluster import META
from tests.harness.fake_cluster import VOLUME_ID
from tests.unit import test_review16
from tests.unit import test_review17
from tests.unit import test_rewound_move
from tests.unit import test_two_nodes


class MarksMixin(test_rewound_move.RewindMixin):

    def host(self):
        return self.c.db.volumes[VOLUME_ID]['host']

    def mark(self):
        return self.b.end_marks.read(VOLUME_ID)

    def tag(self, how, secret=None):
        return move.end_tag(secret or self.c.transfer().secret, how)

    def assert_kept(self):
        """Set back, kept as recorded: nothing retired, wiped or pointed."""
        self.assertEqual([], self.c.violations)
        self.assertEqual(move.PREPARING, self.state())
        self.assertEqual(self.b.host, self.host())
        self.assertIn(LV, self.a.vg.lvs)
        self.assertEqual([], self.a.wiped)
        self.assertIn('rewound', ' '.join(
            str(c) for c in self.log.error.call_args_list))


class RollbackMarkTestCase(MarksMixin, test_two_nodes.ClusterTestCase):
    """R16-1: a rollback cut short after its teardown, then set back."""

    cut_short_then_set_back = \
        test_review16.RewoundRollbackTestCase.cut_short_then_set_back
    assert_back_on_a = test_review16.RewoundRollbackTestCase.assert_back_on_a

    def test_the_mark_goes_with_the_rollback(self):
        src, dst = self.moved(live=True)
        self.c.detach(dst)
        self.assertIsNone(self.c.transfer())
        self.assertIsNone(self.mark())

    def test_the_cut_rollback_leaves_its_mark(self):
        self.cut_short_then_set_back()
        self.assertEqual(self.tag(move.END_ROLLBACK), self.mark())
        self.c.restart(self.b)
        self.assert_back_on_a()
        self.assertIsNone(self.mark())

    def test_a_group_lvm_cannot_list_keeps_the_move(self):
        # (After a reboot, before its PV is scanned: brick reads every LV
        # as absent; LVM's own listing fails.)
        self.cut_short_then_set_back()
        self.b.vg_unlisted = True
        with test_review17.lvm_misses(self.b, names=(LV, META)):
            self.c.restart(self.b)
        self.assert_kept()
        self.b.vg_unlisted = False
        self.c.restart(self.b)
        self.assert_back_on_a()

    def test_without_its_mark_the_move_is_kept(self):
        # (A rollback by an older release, or a mark that could not be
        # written: as on main, for an operator.)
        self.cut_short_then_set_back()
        self.b.end_marks.remove(VOLUME_ID)
        self.c.restart(self.b)
        self.assert_kept()

    def test_a_mark_that_cannot_be_read_is_no_evidence(self):
        self.cut_short_then_set_back()
        self.mock_object(self.b.end_marks, 'read',
                         side_effect=OSError('EIO'))
        self.c.restart(self.b)
        self.assert_kept()

    def test_a_mark_of_another_move_is_no_evidence(self):
        self.cut_short_then_set_back()
        self.b.end_marks.write(VOLUME_ID, self.tag(move.END_ROLLBACK,
                                                   secret='another-move'))
        self.c.restart(self.b)
        self.assert_kept()

    def test_a_swap_mark_is_no_rollback(self):
        self.cut_short_then_set_back()
        self.b.end_marks.write(VOLUME_ID, self.tag(move.END_SWAP))
        self.c.restart(self.b)
        self.assert_kept()

    def test_a_mark_that_cannot_be_written_does_not_stop_the_rollback(self):
        src, dst = self.moved(live=True)
        self.mock_object(self.b.end_marks, 'write',
                         side_effect=OSError('read-only file system'))
        self.c.detach(dst)
        self.c.settle()
        self.assertEqual([], self.c.violations)
        self.assertIsNone(self.c.transfer())
        self.assertEqual(self.a.host, self.host())
        self.assertEqual({}, self.b.vg.lvs)

    def cut_at(self, obj, attr, when='before'):
        """node-b's rollback dies at ``obj.attr``; then the stale save."""
        stale = self.read_while_preparing()
        src, dst = self.moved(live=True)
        self.c.restart_before_timeout = False
        self.c.crash_at(obj, attr, when=when)
        self.assertRaises(oslo_messaging.MessagingTimeout,
                          self.c.detach, dst)
        self.save_whole(stale)
        return src, dst

    def test_a_teardown_cut_before_its_metadata_lv_went_is_kept(self):
        # (The data LV went, its metadata LV not: not what a finished
        # teardown leaves, so not taken for one.)
        self.cut_at(self.b.dest, 'remove_metadata')
        self.assertNotIn(LV, self.b.vg.lvs)
        self.assertIn(META, self.b.vg.lvs)
        self.c.restart(self.b)
        self.assert_kept()
        self.assertIn(META, self.b.vg.lvs)

    def test_a_crash_between_the_mark_and_the_teardown(self):
        # The clone, still loaded, is rolled forward to cloned; Nova's
        # retried detach then rolls it back.
        src, dst = self.cut_at(self.b.dest, 'tear_down')
        self.assertEqual(self.tag(move.END_ROLLBACK), self.mark())
        self.c.restart(self.b)
        self.assertEqual(move.CLONED, self.state())
        self.c.detach(dst)
        self.assert_back_on_a()

    def test_a_reboot_between_the_mark_and_the_teardown(self):
        src, dst = self.cut_at(self.b.dest, 'tear_down')
        self.b.reboot()
        self.b.recover()
        self.assertEqual(move.CLONED, self.state())
        self.assertIn(HANDLE, self.b.dm.devices)
        self.c.detach(dst)
        self.assert_back_on_a()

    def test_a_commit_drops_the_mark_of_a_cut_rollback(self):
        # (A rollback cut before its teardown, then committed: the
        # source's detach.)  A later set-back never reads it.
        src, dst = self.moved(live=True)
        self.b.end_marks.write(VOLUME_ID, self.tag(move.END_ROLLBACK))
        self.c.detach(src)
        self.assertEqual(move.HYDRATING, self.state())
        self.assertIsNone(self.mark())


class SwapMarkTestCase(MarksMixin, test_two_nodes.ClusterTestCase):
    """R16-3: a finalization set back between its swap and its retire."""

    failed_once_set_back = \
        test_review16.RewoundFinalizationTestCase.failed_once_set_back
    retire_fails_once_set_back = \
        test_review16.RewoundFinalizationTestCase.retire_fails_once_set_back

    def test_the_mark_is_on_disk_before_the_swap(self):
        self.moved()
        reload = self.b.dm.reload
        seen = []

        def reload_then_look(name, segments):
            if name == HANDLE and all(s.target == 'linear'
                                      for s in segments):
                seen.append(self.mark())
            return reload(name, segments)
        self.mock_object(self.b.dm, 'reload', side_effect=reload_then_look)
        secret = self.c.transfer().secret
        self.c.settle()
        self.c.assert_completed()
        self.assertEqual([self.tag(move.END_SWAP, secret)], seen)
        self.assertIsNone(self.mark())

    def crash_then_set_back(self, obj, attr, when='before'):
        """node-b's finalization dies at ``obj.attr``; the stale save."""
        stale = self.read_while_preparing()
        self.moved()
        record = self.c.crash_at(obj, attr, when=when)
        self.assertRaises(fake_cluster.Crash, self.c.tick, self.b)
        self.assertTrue(record['fired'])
        self.save_whole(stale)

    def test_a_crash_between_the_mark_and_the_swap(self):
        # (Marked, not swapped: still a clone, rolled forward by it.)
        self.crash_then_set_back(self.b.destination, '_mark_swap', 'after')
        self.assertEqual(self.tag(move.END_SWAP), self.mark())
        self.assertEqual('clone', self.b.dm.devices[HANDLE][0].target)
        self.c.restart(self.b)
        self.c.settle(ticks=8)
        self.assertEqual([], self.c.violations)
        self.c.assert_completed()

    def test_a_reboot_between_the_mark_and_the_swap(self):
        self.crash_then_set_back(self.b.destination, '_mark_swap', 'after')
        self.b.reboot()
        self.b.recover()
        self.c.settle(ticks=8)
        self.assertEqual([], self.c.violations)
        self.c.assert_completed()

    def test_a_crash_between_the_swap_and_the_metadata_removal(self):
        # (Linear, marked, its metadata LV still there: only a swap
        # leaves that.)
        self.crash_then_set_back(self.b.dest, 'remove_metadata')
        self.assertEqual('linear', self.b.dm.devices[HANDLE][0].target)
        self.assertIn(META, self.b.vg.lvs)
        self.c.restart(self.b)
        self.c.settle(ticks=8)
        self.assertEqual([], self.c.violations)
        self.c.assert_completed()

    def test_a_reboot_between_the_swap_and_the_metadata_removal(self):
        # (The clone is built again from its metadata: fully hydrated.)
        self.crash_then_set_back(self.b.dest, 'remove_metadata')
        self.b.reboot()
        self.b.recover()
        self.c.settle(ticks=8)
        self.assertEqual([], self.c.violations)
        self.c.assert_completed()

    def test_without_its_mark_the_move_is_kept(self):
        self.failed_once_set_back()
        self.b.end_marks.remove(VOLUME_ID)
        self.c.settle(ticks=8)
        self.assert_kept()

    def test_a_mark_of_another_move_is_no_evidence(self):
        self.failed_once_set_back()
        self.b.end_marks.write(VOLUME_ID, self.tag(move.END_SWAP,
                                                   secret='another-move'))
        self.c.settle(ticks=8)
        self.assert_kept()

    def test_a_rollback_mark_is_no_swap(self):
        self.failed_once_set_back()
        self.b.end_marks.write(VOLUME_ID, self.tag(move.END_ROLLBACK))
        self.c.settle(ticks=8)
        self.assert_kept()

    def test_a_mark_that_cannot_be_written_does_not_stop_the_finalization(
            self):
        self.moved()
        self.mock_object(self.b.end_marks, 'write',
                         side_effect=OSError('read-only file system'))
        self.c.settle()
        self.c.assert_completed()

    def test_without_a_written_mark_a_set_back_swap_is_kept(self):
        self.mock_object(self.b.end_marks, 'write',
                         side_effect=OSError('read-only file system'))
        stale = self.read_while_preparing()
        self.moved()
        failed = self.retire_fails_once_set_back(stale)
        self.c.settle(ticks=8)
        self.assertEqual([True], failed)
        self.assert_kept()
        self.assertEqual('linear', self.b.dm.devices[HANDLE][0].target)
