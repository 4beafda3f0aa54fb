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

"""The hydration monitor: one status call per tick, isolation of failures."""

import logging
from unittest import mock

import fixtures

from cinder.tests.unit import test

from cinder_dmclone import dmsetup
from cinder_dmclone import hydration
from cinder_dmclone import privileged


def clone(hydrated, total=4096, region=128):
    return dmsetup.parse_clone_status(
        '8 6/2048 %d %d/%d 0 0 4 hydration_threshold 64 '
        'hydration_batch_size 16 rw' % (region, hydrated, total))


class FakeClock(object):
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class ProgressTestCase(test.TestCase):

    def test_first_sample_has_no_rate(self):
        p = hydration.compute_progress(clone(1024))
        self.assertEqual(25.0, p.percent)
        self.assertIsNone(p.rate)
        self.assertIsNone(p.eta)
        self.assertEqual(65536, p.region_bytes)

    def test_rate_and_eta(self):
        prev = hydration.compute_progress(clone(1024))
        p = hydration.compute_progress(clone(2048), prev, 10.0)
        self.assertEqual(1024 * 65536 / 10.0, p.rate)
        # 2048 regions to go at 1024 regions per 10 s.
        self.assertEqual(20.0, p.eta)
        self.assertEqual({'hydrated_regions': '2048',
                          'total_regions': '4096', 'percent': '50.0',
                          'rate_bps': '6710886', 'eta_seconds': '20',
                          'stalled_seconds': '0'},
                         p.as_dict())

    def test_stalled_has_no_eta(self):
        prev = hydration.compute_progress(clone(1024))
        p = hydration.compute_progress(clone(1024), prev, 10.0)
        self.assertEqual(0.0, p.rate)
        self.assertIsNone(p.eta)
        self.assertEqual('', p.as_dict()['eta_seconds'])

    def test_stalled_seconds_are_carried(self):
        p = hydration.compute_progress(clone(1024), stalled=42.7)
        self.assertEqual('42', p.as_dict()['stalled_seconds'])

    def test_done(self):
        prev = hydration.compute_progress(clone(4000))
        p = hydration.compute_progress(clone(4096), prev, 1.0)
        self.assertEqual(0.0, p.eta)
        self.assertEqual(1.0, p.fraction)

    def test_zero_regions(self):
        p = hydration.Progress(0, 0, 65536)
        self.assertEqual(1.0, p.fraction)
        self.assertEqual('', p.as_dict()['rate_bps'])


class MonitorTestCase(test.TestCase):

    def setUp(self):
        super().setUp()
        self.dm = mock.Mock()
        self.seen = []
        self.clock = FakeClock()
        self.monitor = hydration.HydrationMonitor(
            self.dm, 'vg', self._record, interval=5, clock=self.clock)

    def _record(self, lv_name, status, progress):
        self.seen.append((lv_name, status, progress))

    def test_one_status_call_for_many_volumes(self):
        self.dm.clone_statuses.return_value = {
            'dmclone-vg-volume-%04d' % i: clone(i) for i in range(1000)}
        report = self.monitor.tick()
        self.assertEqual(1, self.dm.clone_statuses.call_count)
        self.assertEqual(1000, report.seen)
        self.assertEqual(1000, report.handled)
        self.assertEqual(1000, len(self.seen))

    def test_one_unreadable_status_costs_only_its_volume(self):
        # a real DMSetup parsing the kernel's text: a feature this code
        # does not know, or a foreign name with ':' in it, must not stop
        # the other volumes' tick
        good = ('8 6/2048 128 %d/4096 0 0 4 hydration_threshold 1 '
                'hydration_batch_size 1 rw')
        bad_line = ('dmclone-vg-volume-b: 0 524288 clone 8 6/2048 128 '
                    '1/4096 0 1 new_feature 0 rw')
        text = '\n'.join([
            'dmclone-vg-volume-a: 0 524288 clone ' + good % 1,
            bad_line,
            'someone:else: 0 524288 clone ' + good % 3,
            'dmclone-vg-volume-c: 0 524288 clone ' + good % 4]) + '\n'
        execute = mock.Mock(return_value=(text, ''))
        self.monitor._dm = privileged.DMSetup(execute=execute)
        self.clock.now += 5
        self.monitor._last['volume-b'] = (95.0, 'earlier', 90.0)
        log = self.useFixture(fixtures.FakeLogger(level=logging.WARNING))
        report = self.monitor.tick()
        self.assertEqual(['volume-a', 'volume-c'], [s[0] for s in self.seen])
        self.assertEqual(2, report.handled)
        self.assertEqual(['volume-b'], report.failed)
        self.assertIn(bad_line, log.output)
        self.assertNotIn('someone:else', log.output)
        # the unreadable volume keeps its last sample for the next tick
        self.assertEqual((95.0, 'earlier', 90.0),
                         self.monitor._last['volume-b'])

    def test_unattributable_status_line_is_logged(self):
        self.dm.clone_statuses.side_effect = (
            lambda errors: errors.update({None: ValueError('garbage')})
            or {'dmclone-vg-volume-a': clone(2)})
        log = self.useFixture(fixtures.FakeLogger(level=logging.WARNING))
        report = self.monitor.tick()
        self.assertEqual(['volume-a'], [s[0] for s in self.seen])
        self.assertEqual([None], report.failed)
        self.assertIn('garbage', log.output)

    def test_ignores_foreign_devices(self):
        self.dm.clone_statuses.return_value = {
            'someone-elses-clone': clone(1), 'dmclone-vg-volume-a': clone(2),
            'dmclone-other--vg-volume-b': clone(3)}
        self.monitor.tick()
        self.assertEqual(['volume-a'], [s[0] for s in self.seen])

    def test_rate_between_ticks(self):
        self.dm.clone_statuses.return_value = {'dmclone-vg-v': clone(1000)}
        self.monitor.tick()
        self.clock.now += 5
        self.dm.clone_statuses.return_value = {'dmclone-vg-v': clone(2000)}
        self.monitor.tick()
        progress = self.seen[-1][2]
        self.assertEqual(1000 * 65536 / 5, progress.rate)

    def test_forgets_finished_volumes(self):
        self.dm.clone_statuses.return_value = {'dmclone-vg-v': clone(1000)}
        self.monitor.tick()
        self.dm.clone_statuses.return_value = {}
        self.monitor.tick()
        self.dm.clone_statuses.return_value = {'dmclone-vg-v': clone(2000)}
        self.monitor.tick()
        self.assertIsNone(self.seen[-1][2].rate)

    def _stalled_after(self, *counts, **kwargs):
        """Tick once per hydrated count, 10 s apart; the last stall."""
        for count in counts:
            self.dm.clone_statuses.return_value = {
                'dmclone-vg-v': kwargs.get('make', clone)(count)}
            self.monitor.tick()
            self.clock.now += 10
        return self.seen[-1][2].stalled_seconds

    def test_advancing_clone_is_not_stalled(self):
        self.assertEqual(0, self._stalled_after(10, 20, 30))

    def test_stall_counts_from_the_last_advance(self):
        self.assertEqual(0, self._stalled_after(10))
        # Advanced at the first 20, then two ticks 10 s apart without.
        self.assertEqual(20, self._stalled_after(20, 20, 20))

    def test_stall_ends_when_copying_resumes(self):
        self.assertEqual(20, self._stalled_after(10, 10, 10))
        self.assertEqual(0, self._stalled_after(11))

    def test_clone_waiting_for_its_commit_is_not_stalled(self):
        def no_hydration(count):
            return dmsetup.parse_clone_status(
                '8 6/2048 128 %d/4096 0 1 no_hydration 0 rw' % count)
        self.assertEqual(0, self._stalled_after(5, 5, 5, make=no_hydration))

    def test_finished_clone_is_not_stalled(self):
        self.assertEqual(0, self._stalled_after(4096, 4096, 4096))

    def test_failed_clone_is_reported_without_progress(self):
        self.dm.clone_statuses.return_value = {
            'dmclone-vg-v': dmsetup.FailedCloneStatus('Fail')}
        self.monitor.tick()
        self.assertTrue(self.seen[0][1].failed)
        self.assertIsNone(self.seen[0][2])

    def test_one_failing_volume_does_not_stop_others(self):
        def on_status(lv_name, status, progress):
            if lv_name == 'volume-b':
                raise RuntimeError('boom')
            self.seen.append(lv_name)
        monitor = hydration.HydrationMonitor(self.dm, 'vg', on_status, 5)
        self.dm.clone_statuses.return_value = {
            'dmclone-vg-volume-a': clone(1), 'dmclone-vg-volume-b': clone(1),
            'dmclone-vg-volume-c': clone(1)}
        report = monitor.tick()
        self.assertEqual(['volume-a', 'volume-c'], self.seen)
        self.assertEqual(['volume-b'], report.failed)
        self.assertEqual(2, report.handled)

    def test_unreadable_foreign_status_line_is_not_ours(self):
        # Another backend's handle whose line cannot be parsed: neither
        # logged nor counted against this backend's volumes.
        self.dm.clone_statuses.side_effect = (
            lambda errors: errors.update(
                {'dmclone-other-volume-x': ValueError('garbage')})
            or {'dmclone-vg-volume-a': clone(2)})
        log = self.useFixture(fixtures.FakeLogger(level=logging.WARNING))
        report = self.monitor.tick()
        self.assertEqual(['volume-a'], [s[0] for s in self.seen])
        self.assertEqual([], report.failed)
        self.assertNotIn('garbage', log.output)

    def test_after_tick_runs_once_after_the_statuses(self):
        order = []
        monitor = hydration.HydrationMonitor(
            self.dm, 'vg', lambda lv, *a: order.append(lv), 5,
            after_tick=lambda: order.append('after'))
        self.dm.clone_statuses.return_value = {
            'dmclone-vg-volume-a': clone(1), 'dmclone-vg-volume-b': clone(1)}
        monitor.tick()
        self.assertEqual(['volume-a', 'volume-b', 'after'], order)

    def test_after_tick_failure_is_contained(self):
        # (The retried finalizations: a failure there must not stop the
        # monitor's next ticks.)
        after = mock.Mock(side_effect=RuntimeError('finalize broke'))
        monitor = hydration.HydrationMonitor(
            self.dm, 'vg', self._record, 5, after_tick=after)
        self.dm.clone_statuses.return_value = {
            'dmclone-vg-volume-a': clone(1)}
        log = self.useFixture(fixtures.FakeLogger(level=logging.WARNING))
        report = monitor.tick()
        self.assertEqual(1, report.handled)
        self.assertEqual([], report.failed)
        self.assertIn('follow-up work failed', log.output)
        monitor.tick()
        self.assertEqual(2, after.call_count)
        self.assertEqual(2, len(self.seen))

    def test_status_failure_is_contained(self):
        self.dm.clone_statuses.side_effect = RuntimeError('dmsetup broke')
        report = self.monitor.tick()
        self.assertEqual([None], report.failed)
        self.assertEqual([], self.seen)

    @mock.patch('oslo_service.loopingcall.FixedIntervalLoopingCall')
    def test_start_stop(self, mock_loop):
        timer = self.monitor.start()
        self.assertIs(timer, self.monitor.start())
        mock_loop.assert_called_once_with(self.monitor.tick)
        timer.start.assert_called_once_with(
            interval=5, initial_delay=5, stop_on_exception=False)
        self.monitor.stop()
        timer.stop.assert_called_once_with()
        self.monitor.stop()
