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

import unittest

import oslo_messaging

from cinder_dmclone import move
from cinder_dmclone import peer
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

    # R16-1: a rollback cut short after its teardown, then set back.  The
    # rollback's teardown wiped node-b's clone; node-b died before it
    # pointed the record back at node-a.  Unset back, node-b's start
    # finishes the rollback (cloned, no data LV: ROLL_BACK).  Set back to
    # preparing, the record names node-b, which holds nothing, while the
    # instance on node-a writes the only copy; nothing ends the move
    # (node-b cannot roll it forward, node-a leaves it to node-b), and
    # every request for the volume goes to node-b and is refused.
    @unittest.expectedFailure
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

    # R16-3: set back after the swap to linear, before node-a retired its
    # copy.  node-b's clone is gone (linear, metadata LV removed), so the
    # move is kept as "cannot be rolled forward"; the pending
    # finalization fails at every tick (its transition expects
    # hydrating), and is forgotten at a restart.  node-a's old copy and
    # its export admitting node-b are never retired; the operator remedy
    # logged ("if the move had finished ... remove its dmclone_* admin
    # metadata keys") then leaves them described by nothing.
    @unittest.expectedFailure
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

    def test_set_back_while_finalizing_keeps_both_copies(self):
        # (What R16-3 leaves: nothing lost, nothing finished.)
        stale = self.read_while_preparing()
        self.moved()
        self.retire_fails_once_set_back(stale)
        self.c.settle(ticks=8)
        self.assertEqual(move.PREPARING, self.state())
        self.assertEqual({HANDLE}, set(self.b.dm.devices))
        self.assertTrue(self.b.vg.lvs[LV]['complete'])
        self.assertIn(LV, self.a.vg.lvs)
        self.assertEqual([], self.b.wiped)
        self.assertEqual([], self.c.violations)
        self.assertTrue(self.log.exception.called)
