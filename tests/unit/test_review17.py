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

"""Review 17: the R16-1 / R16-3 endings of a set-back move (646ea97).

Each test is a sequence that loses data, leaves a copy unwiped or
points the volume at a node without it, through ``Destination._emptied``
(R16-1) or ``Destination._swapped`` (R16-3).  They failed on 646ea97
(expectedFailure); they pass since _emptied and _swapped ask for this
node's end mark of the move and, for a rollback, LVM's own listing of
its groups (see test_end_marks).  They are the reviewer's, not fixes.
"""

import contextlib
from unittest import mock

from cinder.tests.unit import test

from cinder_dmclone import move
from tests.harness import fake_cluster
from tests.harness.fake_cluster import HANDLE
from tests.harness.fake_cluster import LV
from tests.harness.fake_cluster import META
from tests.harness.fake_cluster import VOLUME_ID
from tests.unit import test_lost_source
from tests.unit import test_review16
from tests.unit import test_rewound_move
from tests.unit import test_two_nodes


@contextlib.contextmanager
def lvm_misses(node, names=(LV,)):
    """``lvs VG/LV`` on ``node`` answers "not found" for ``names``.

    What brick's LVM.get_lv_info turns into "no such LV" (it swallows a
    ProcessExecutionError whose stderr holds "not found" or "Failed to
    find", e.g. 'Volume group "X" not found' while a PV is not scanned
    yet after a reboot, or a VG briefly unreadable): get_volume() is
    None, and Clones.has_data() False, for as long as it lasts.
    """
    get = node.vg.get_volume
    get_all = node.vg.get_volumes

    def get_volume(name):
        return None if name in names else get(name)

    def get_volumes(lv_name=None):
        return [lv for lv in get_all(lv_name)
                if lv is not None and lv['name'] not in names]
    with mock.patch.object(node.vg, 'get_volume', side_effect=get_volume), \
            mock.patch.object(node.vg, 'get_volumes',
                              side_effect=get_volumes):
        yield


class EmptiedTestCase(test_rewound_move.RewindMixin,
                      test_two_nodes.ClusterTestCase):
    """Destination._emptied: "no data LV here" taken as a cut rollback."""

    def host(self):
        return self.c.db.volumes[VOLUME_ID]['host']

    def assert_still_on_b(self):
        """The committed move is not rolled back: node-b is the volume."""
        self.assertEqual([], self.c.violations)
        self.assertEqual(self.b.host, self.host())
        self.assertIn(LV, self.b.vg.lvs)
        self.assertEqual([], self.b.wiped)

    # HIGH.  A transient LVM miss rolls a committed move back.
    # Sequence: node-b's attach moves the volume (committed, hydrating;
    # the instance writes node-b's clone); a stale whole save sets the
    # record back to preparing (R14-4); node-b reboots; at its start
    # LVM answers "not found" for the data LV once (brick maps that to
    # None: a PV not scanned yet, a VG briefly unreadable).  Recovery's
    # ROLL_FORWARD -> _roll_forward -> _emptied() is True (one read of
    # has_data(), nothing else corroborates it: the metadata LV is
    # still there, which no finished teardown leaves), so
    # _roll_back_emptied writes `cloned` and rolls back: node-b's
    # metadata LV (the only record of which regions hold the instance's
    # writes) is removed, the volume record is pointed at node-a, whose
    # copy lacks every write made since the commit, and the move is
    # cleared.  Node-b's data LV stays behind, described by nothing and
    # never wiped.  Data loss (silent) and a leaked copy.  Before
    # 646ea97 the same start kept the set-back move (reported).
    def test_transient_lvm_miss_at_start_rolls_a_committed_move_back(self):
        stale = self.read_while_preparing()
        self.moved()
        self.assertEqual(move.HYDRATING, self.state())
        self.save_whole(stale)
        self.b.reboot()
        with lvm_misses(self.b):
            self.b.recover()
        self.assertEqual(self.b.host, self.host())      # fails: node-a
        self.assertIn(META, self.b.vg.lvs)              # (removed)
        self.c.settle()
        self.assert_still_on_b()

    # HIGH.  The same at a monitor tick, no reboot: the set-back clone
    # of a migrated (available, so nothing holds the handle open)
    # volume is seen by the monitor (drop_stale_prepare ->
    # _roll_forward) during a tick in which LVM misses the data LV:
    # the loaded clone (which proves the LV is there) is torn down, its
    # metadata LV removed, the record pointed back at node-a, the move
    # cleared.  Writes made on node-b after the migration (the volume
    # was usable there at once) are lost; node-b's LV leaks.
    def test_transient_lvm_miss_at_a_tick_rolls_a_migration_back(self):
        stale = self.read_while_preparing()
        self.assertTrue(self.c.migrate(self.b))
        self.assertEqual(move.HYDRATING, self.state())
        self.save_whole(stale)
        with lvm_misses(self.b):
            self.c.tick(self.b)
        self.assertEqual(self.b.host, self.host())      # fails: node-a
        self.assertIn(HANDLE, self.b.dm.devices)
        self.c.settle()
        self.assert_still_on_b()

    # MEDIUM.  A stale save landing long after, once the volume's LV has
    # another name (_name_id), is taken for a cut rollback.
    # Sequence: copy S read while move 1 (node-a -> node-b, LV
    # volume-<X>) prepares; move 1 finishes; the in-use volume is then
    # copied by Cinder's generic migration (a retype with
    # --migration-policy on-demand by its owner, or an admin's migrate)
    # so its LV is volume-<_name_id>, and moved back to node-b (move 2,
    # finished: node-a's copy retired).  S lands (R14-4): move 1,
    # preparing, LV volume-<X>, which node-b does not hold.  _emptied
    # checks only has_data(t) and the status: unlike _swapped it has no
    # proof that the record is recent (provider_location), so node-b's
    # start "finishes the rollback": the record is pointed at node-a,
    # which holds nothing of the volume; node-b's LV, the only copy,
    # stays, described by nothing, never wiped.  Modelled here by S
    # naming an LV other than the one node-b holds.
    def test_a_late_stale_save_naming_an_older_lv_moves_the_record(self):
        stale = self.read_while_preparing()
        self.moved()
        self.c.settle()
        self.c.assert_completed()
        self.save_whole(dict(
            stale,
            dmclone_lv_name='volume-00000000-0000-4000-8000-0000000000aa'))
        self.c.restart(self.b)
        self.c.settle()
        self.assertEqual({}, self.a.vg.lvs)
        self.assertEqual(self.b.host, self.host())      # fails: node-a


class SwappedTestCase(test_rewound_move.RewindMixin,
                      test_two_nodes.ClusterTestCase):
    """Destination._swapped: a linear handle taken for a finalization."""

    failed_once_set_back = \
        test_review16.RewoundFinalizationTestCase.failed_once_set_back

    # LOW.  R16-3's fix does nothing with a multi-portal export.
    # Cinder's iSCSI targets write provider_location as
    # "<portal>[;<portal>...],<tid> <iqn> <lun>" (target_secondary_ip_
    # addresses; the driver's own _owns_export parses the ';').
    # _names_source_export compares location[0].split(',')[0], i.e.
    # "10.0.0.1:3260;10.0.1.1:3260", with the move's single portal:
    # never equal, so a finalization set back between the swap and the
    # retire is kept "for an operator" as before R16-3: node-a's old
    # copy and its export admitting node-b are never retired or wiped.
    def test_a_multi_portal_export_still_retires_the_source(self):
        self.failed_once_set_back()
        rec = self.c.db.volumes[VOLUME_ID]
        portal, rest = rec['provider_location'].split(',', 1)
        rec['provider_location'] = '%s;10.0.1.1:3260,%s' % (portal, rest)
        self.c.settle(ticks=8)
        self.c.assert_completed()


class AbandonSetBackTestCase(test.TestCase):
    """An abandon-source cut short, then a stale save: _swapped misfires."""

    # MEDIUM.  The lost source's copy, which holds the only copy of the
    # regions never copied, is wiped.
    # Sequence: node-b hydrates from node-a (copy S of the admin
    # metadata read while it was preparing); node-a is lost; the
    # operator runs "cinder-dmclone move abandon-source", which zeroes
    # the regions never copied, removes the metadata LV and maps the LV
    # linearly (steps 7-9), then dies before forget_source_export.  S
    # lands (R14-4): source_lost -> preparing (dropping the loss record
    # keys too).  node-a comes back; node-b's service restarts.  Now
    # _swapped() holds: data LV without metadata LV, a linear handle
    # (the abandon's, not a swap: "only a swap maps it so" is false),
    # provider_location still node-a's export.  The move is rolled
    # forward to finalizing and finalized: node-a's copy is RETIREd
    # (wiped), the move cleared, the volume no longer in error.  The
    # module's promise ("node A's copy is left as it was: never wiped")
    # is broken, and the zeroed regions are lost for good.
    def test_a_cut_abandon_set_back_keeps_the_lost_nodes_copy(self):
        h = test_lost_source.Harness(self, hydrated=range(100))
        stale = {k: v for k, v in h.c.db.admin_metadata[VOLUME_ID].items()
                 if k.startswith(move.KEY_PREFIX)}
        stale[move.KEY_PREFIX + 'state'] = move.PREPARING
        h.lose_a()
        h.arm_crash(('store', 'forget_source_export', None), 'before')
        self.assertRaises(fake_cluster.Crash, h.run)
        self.assertEqual(move.SOURCE_LOST, h.c.transfer().state)
        h.c.db.volume_admin_metadata_update(h.c.ctxt, VOLUME_ID, stale,
                                            True)
        h.a.down = False
        h.a.service_up = True
        h.c.restart(h.a)
        h.c.restart(h.b)
        h.c.settle()
        self.assertEqual([], h.c.violations)
        self.assertEqual([], h.a.wiped)                  # fails: wiped
        self.assertEqual([LV], list(h.a.vg.lvs))
