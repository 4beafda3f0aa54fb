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

"""Old copies are wiped and removed off the request path."""

import threading
from unittest import mock

from cinder.tests.unit import test

from cinder_dmclone import exception as dmc_exception
from cinder_dmclone import layout
from cinder_dmclone import wiper
from tests.unit import fakes

VG = 'dmc-vg'
LV = 'volume-0a1b2c3d-0000-4000-8000-000000000001'


class WiperTestCase(test.TestCase):

    def setUp(self):
        super().setUp()
        self.dm = fakes.FakeDMSetup()
        self.vg = fakes.FakeLVM(VG, self.dm)
        self.vg.add(LV, '1g')
        self.wiped = []
        self.spawned = []
        self.log = self.mock_object(wiper, 'LOG')

    def make(self, wipe=True, run_now=True):
        def spawn(fn, *args):
            self.spawned.append(args)
            if run_now:
                fn(*args)
        return wiper.Wiper(
            self.vg, self.dm, spawn=spawn,
            wipe=(lambda path, mb: self.wiped.append((path, mb)))
            if wipe else None)

    def test_without_clearing_the_lv_is_deleted_at_once(self):
        self.make(wipe=False).discard(LV)
        self.assertEqual({}, self.vg.lvs)
        self.assertEqual([], self.spawned)

    def test_renamed_at_once_then_wiped_and_removed(self):
        w = self.make(run_now=False)
        w.discard(LV)
        # The name is free when discard returns; the data is not gone yet.
        self.assertNotIn(LV, self.vg.lvs)
        (retiring,), = self.spawned
        self.assertTrue(layout.is_retiring_lv(retiring))
        self.assertTrue(retiring.startswith(LV + layout.RETIRING_MARK))
        self.assertIn(retiring, self.vg.lvs)
        w._run(retiring)
        self.assertEqual([('/dev/%s/%s' % (VG, retiring), 1024)],
                         self.wiped)
        self.assertEqual({}, self.vg.lvs)

    def test_nothing_to_discard(self):
        self.make().discard('volume-absent')
        self.assertEqual([], self.spawned)

    def strict(self, lv_names):
        w = self.make()
        w.lv_names = lv_names
        # (brick's lookup must not decide once LVM's own listing does.)
        self.mock_object(self.vg, 'get_volume', side_effect=AssertionError)
        return w

    def test_lvms_own_listing_decides(self):
        self.strict(lambda: {LV}).discard(LV)
        self.assertEqual({}, self.vg.lvs)
        self.assertEqual(1, len(self.wiped))

    def test_an_lv_lvm_does_not_list_is_gone(self):
        self.strict(lambda: {'volume-other'}).discard(LV)
        self.assertIn(LV, self.vg.lvs)      # (what brick would have seen)
        self.assertEqual([], self.spawned)

    def test_an_unlisted_group_fails_the_step_touching_nothing(self):
        # A volume group not found (a PV not scanned yet after a reboot):
        # brick would answer "no LV" and the caller would go on as if the
        # old copy were gone, leaving it unwiped for good.
        def unlisted():
            raise dmc_exception.LVMUnlisted(vg=VG, reason='not found')
        w = self.strict(unlisted)
        self.assertRaises(dmc_exception.LVMUnlisted, w.discard, LV)
        self.assertIn(LV, self.vg.lvs)
        self.assertEqual([], self.spawned)

    def test_one_wipe_per_lv_at_a_time(self):
        w = self.make(run_now=False)
        self.vg.add(LV + '-dmcwipe-0123abcd', '1g')
        w.resume()
        w.resume()
        self.assertEqual([(LV + '-dmcwipe-0123abcd',)], self.spawned)

    def test_resume_wipes_what_a_stopped_service_left(self):
        self.vg.add(LV + '-dmcwipe-0123abcd', '1g')
        self.vg.add('volume-other', '1g')
        self.make().resume()
        self.assertEqual(['/dev/%s/%s-dmcwipe-0123abcd' % (VG, LV)],
                         [p for p, mb in self.wiped])
        self.assertEqual([LV, 'volume-other'], sorted(self.vg.lvs))
        self.log.warning.assert_called_once()

    def test_resume_after_clearing_was_turned_off_removes_the_copy(self):
        # A copy renamed for wiping under volume_clear=zero; the operator
        # then set volume_clear=none and restarted: the copy must go, as
        # any LV deleted now would, not stay forever behind a TypeError.
        self.vg.add(LV + '-dmcwipe-0123abcd', '1g')
        self.make(wipe=False).resume()
        self.assertEqual({LV: self.vg.lvs[LV]}, self.vg.lvs)
        self.log.exception.assert_not_called()

    def test_failed_wipe_keeps_the_lv_for_the_next_start(self):
        w = wiper.Wiper(self.vg, self.dm, spawn=lambda fn, *a: fn(*a),
                        wipe=mock.Mock(side_effect=OSError('dd died')))
        w.discard(LV)
        (retiring,) = list(self.vg.lvs)
        self.assertTrue(layout.is_retiring_lv(retiring))
        self.log.exception.assert_called_once()
        # Not busy any more: the next start wipes it again.
        w.wipe = lambda path, mb: self.wiped.append(path)
        w.resume()
        self.assertEqual({}, self.vg.lvs)

    def test_default_spawn_runs_in_a_thread(self):
        done = threading.Event()
        thread = wiper._spawn(done.set)
        thread.join(10)
        self.assertTrue(done.is_set())
        self.assertTrue(thread.daemon)


class RetiringNameTestCase(test.TestCase):

    def test_names(self):
        name = layout.retiring_lv_name(LV, 'deadbeef')
        self.assertEqual(LV + '-dmcwipe-deadbeef', name)
        self.assertTrue(layout.is_retiring_lv(name))
        for other in (LV, LV + '-dmcmeta', LV + '-dmcwipe-xyz', None,
                      '-dmcwipe-deadbeef', LV + '-dmcwipe-deadbeef0'):
            self.assertFalse(layout.is_retiring_lv(other), other)
