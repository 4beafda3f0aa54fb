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

"""Review 13 of integ3: the thin revert (a merge of the thin snapshot).

Each test names its finding (R13-n).  A test that fails shows the
defect; see the review's report for the sequence and the fix it asks.
Cinder 29's manager (volume/manager.py revert_to_snapshot) sets the
volume to ``error`` and the snapshot back to ``available`` (from
``restoring``) whatever the driver raised, and keeps its backup
snapshot.
"""

from unittest import mock

from oslo_concurrency import processutils

from cinder import exception
from cinder.objects import fields

from tests.unit import test_driver
from tests.unit.test_driver import HANDLE
from tests.unit.test_driver import LV


class ThinRevertTestCase(test_driver.DriverTestBase):

    def setUp(self):
        super().setUp()
        self.drv.configuration.lvm_type = 'thin'
        self._make_handle()
        self.snap = self._snapshot()
        self.snap_lv = '_' + self.snap.name
        self.lvs[self.snap_lv] = '1.00'

    def test_r13_1_volume_held_open_leaves_no_silent_pending_merge(self):
        # R13-1.  Something other than the handle holds the volume's LV
        # open (lvs attr[5] 'o'; a leftover device-mapper device over
        # the LV, an operator's dd...).  lvconvert --merge of a thin
        # snapshot then succeeds and DEFERS the merge to the LV's next
        # activation; lvchange -an fails ("in use").  The revert raises
        # that raw error: nothing tells the operator a merge is pending.
        # The manager sets the volume to error; an admin resets it to
        # available, the tenant writes to it, and the next activation of
        # the LV (a reboot's autoactivation) swaps the snapshot in:
        # every write since is lost, silently, and the snapshot's LV is
        # consumed under a record that says available.  Either the
        # revert must refuse before lvconvert --merge (the LV or the
        # snapshot open: nothing changed), or its error must say that a
        # merge is pending.
        self.vg.lv_is_open.side_effect = lambda name: name == LV
        self.vg.deactivate_lv.side_effect = (
            processutils.ProcessExecutionError(
                cmd='lvchange -a n dmc-vg/%s' % LV, exit_code=5,
                stderr='  Logical volume dmc-vg/%s in use.\n' % LV))
        exc = self.assertRaises(
            (exception.CinderException, processutils.ProcessExecutionError),
            self.drv.revert_to_snapshot, self.ctxt, self.volume, self.snap)
        if self.vg.revert.called:
            self.assertIn('pending', str(exc))
        self.vg.create_lv_snapshot.assert_not_called()
        self.assertIn(HANDLE, self.dm.devices)

    def test_r13_2_snapshot_not_made_again_is_not_left_available(self):
        # R13-2.  The merge is done (the snapshot's LV consumed) but the
        # snapshot cannot be made again (pool full, a DB error in
        # _refuse_reading_elsewhere...).  The driver raises: Cinder's
        # manager sets the volume, which IS reverted, to error, and the
        # snapshot back to available although it has no LV; the
        # "delete the snapshot" advice is in the service log only.  A
        # later create-from-snapshot or revert to it fails (the revert
        # puts the volume in error again).  The snapshot record must not
        # be left claiming a usable snapshot: the driver marks it error
        # (the manager's restoring -> available update then does not
        # apply), and the reverted volume need not go to error.
        # (merged: LVM no longer lists the snapshot's LV)
        self.vg.revert.side_effect = lambda name: self.lvs.pop(name)
        self.vg.create_lv_snapshot.side_effect = (
            processutils.ProcessExecutionError(
                cmd='lvcreate', exit_code=5,
                stderr='  Cannot create new thin volume, free space in '
                       'thin pool dmc-vg/dmc-vg-pool reached threshold.\n'))
        self.snap.status = fields.SnapshotStatus.RESTORING
        with mock.patch.object(self.snap, 'save'):
            try:
                self.drv.revert_to_snapshot(self.ctxt, self.volume,
                                            self.snap)
            except Exception:
                pass
        self.vg.revert.assert_called_once_with(self.snap_lv)
        self.assertEqual(fields.SnapshotStatus.ERROR, self.snap.status)
        self.assertIn(HANDLE, self.dm.devices)
