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

"""Review 23 (branch r18-2, 6a6dded): the new powers, as controls.

No new finding reproduced within the review's time: each test below is
a control of a sequence the review suspected (a retire carrying
``deleting`` delivered late or forged, an abort by a mark's secret
delivered late, a reboot of either node while move 2's abort was lost)
and that the branch handles.  They are the reviewer's, not fixes.
"""

from cinder import exception

from cinder_dmclone import peer
from tests.harness.fake_cluster import LV
from tests.harness.fake_cluster import META
from tests.harness.fake_cluster import VOLUME_ID
from tests.unit import test_stale_first_move
from tests.unit import test_two_nodes


class LateRetireTestCase(test_stale_first_move.SecondMoveMixin,
                         test_two_nodes.ClusterTestCase):
    """Move 2 committed, its record replaced by move 1's (R18-2)."""

    def retire(self, secret, status, deleting=True):
        self.c.db.volumes[VOLUME_ID]['status'] = status
        step = {'op': peer.RETIRE, 'secret': secret}
        if deleting:
            step[peer.DELETING] = True
        return self.c.call(self.a, self.a.terminate_connection,
                           self.c.volume(), dict(self.b.props, dmclone=step))

    # Control: a retire carrying ``deleting`` that lands once the volume
    # is no longer being deleted (a timed-out delete, then an admin's
    # reset-state to available) is a plain retire: node-a's mark of
    # move 2 refuses it, nothing is removed on either node.
    def test_control_a_late_deleting_retire_after_a_reset(self):
        self.set_back()
        self.remember_wiped()
        first = self.c.transfer().secret
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.retire, first, 'available')
        self.assert_both_copies_kept()
        self.assertIn(self.second_secret,
                      self.a.part_marks.read(VOLUME_ID))

    # Control: ``error_deleting`` left by a failed delete does not turn
    # a retire without the flag (a finalization's) into a delete.
    def test_control_error_deleting_without_the_flag(self):
        self.set_back()
        self.remember_wiped()
        first = self.c.transfer().secret
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.retire, first, 'error_deleting',
                          deleting=False)
        self.assert_both_copies_kept()

    # Control: the owner's forged retire (through the public API, with a
    # ``deleting`` entry and no secret) while the volume is deleting.
    def test_control_a_forged_deleting_retire(self):
        self.set_back()
        self.remember_wiped()
        for secret in (None, '', 'ab' * 16, self.second_secret):
            self.assertRaises(exception.VolumeBackendAPIException,
                              self.retire, secret, 'deleting')
        self.assert_both_copies_kept()


class LostAbortRebootTestCase(test_stale_first_move.SecondMoveMixin,
                              test_two_nodes.ClusterTestCase):
    """Move 2 given up before its commit, its abort lost (review 21)."""

    # Control: node-b's start acts on move 1's record (node-b its
    # destination by the record, which names node-b): its copy, the
    # volume, stays.
    def test_control_the_source_rebooting_keeps_the_volume(self):
        self.remember_wiped()
        self.set_back_before_the_commit(abort_reaches_a=False)
        self.b.reboot()
        self.b.recover()
        self.c.now += 3600
        self.c.settle(ticks=8)
        self.assertEqual([], self.c.violations)
        self.assertIn(LV, self.b.vg.lvs)
        self.assertTrue(self.b.vg.lvs[LV]['complete'])
        self.assertFalse(self.wiped_here_since(self.b, self.wiped_before))

    # Control: node-a's start cannot write move 2 back (never
    # committed): nothing of it is rebuilt, mapped or removed.
    def test_control_the_destination_rebooting_keeps_both(self):
        self.remember_wiped()
        self.set_back_before_the_commit(abort_reaches_a=False)
        self.a.reboot()
        self.a.recover()
        self.c.now += 3600
        self.c.settle(ticks=8)
        self.assertEqual([], self.c.violations)
        self.assertIn(LV, self.b.vg.lvs)
        self.assertIn(META, self.a.vg.lvs)
        self.assertEqual({}, self.a.dm.devices)
