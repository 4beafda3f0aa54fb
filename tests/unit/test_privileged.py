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

"""The root commands of privileged.py, and how their failures are told.

``execute`` is a mock: these tests check the command lines built and
what each exit status and message becomes.  rootwrap's view of the same
command lines is in test_rootwrap.py, the real commands run in the
functional suite.
"""

import ast
import logging
import os
import subprocess
from unittest import mock

import ddt
import fixtures
from oslo_concurrency import processutils

from cinder.tests.unit import test

from cinder_dmclone import dmsetup
from cinder_dmclone import exception
from cinder_dmclone import privileged
from tests.unit import test_dmsetup

# status lines the 6.1 kernel printed (see test_dmsetup.py)
CREATED = test_dmsetup.CREATED
HYDRATED = test_dmsetup.HYDRATED


def failure(code, stderr, stdout=''):
    """What Cinder's execute raises for a command that exited ``code``."""
    return processutils.ProcessExecutionError(exit_code=code, stdout=stdout,
                                              stderr=stderr)


@ddt.ddt
class DMSetupCommandTestCase(test.TestCase):

    def setUp(self):
        super().setUp()
        self.execute = mock.Mock(return_value=('', ''))
        self.dm = privileged.DMSetup(execute=self.execute,
                                     root_helper='sudo cinder-rootwrap x')

    def _assert_called(self, *args, **kwargs):
        kwargs.setdefault('run_as_root', True)
        kwargs.setdefault('root_helper', 'sudo cinder-rootwrap x')
        self.execute.assert_called_with(*privileged.ENV_PREFIX, *args,
                                        **kwargs)

    def test_default_execute_is_cinders(self):
        from cinder import utils
        self.assertIs(utils.execute, privileged.DMSetup()._execute)

    def test_no_root_helper_given(self):
        dm = privileged.DMSetup(execute=self.execute)
        dm.resume('a')
        self.execute.assert_called_with(*privileged.ENV_PREFIX, 'dmsetup',
                                        'resume', 'a', run_as_root=True)

    def test_every_command_runs_under_lc_all_c(self):
        self.execute.side_effect = lambda *cmd, **kw: (
            ('8\n', '') if 'blockdev' in cmd else ('', ''))
        seg = dmsetup.linear_segment(0, 8, '/dev/vg/lv')
        self.dm.create('h', [seg], uuid='DMCLONE-h')
        self.dm.reload('h', [seg])
        self.dm.remove('h')
        self.dm.exists('h')
        self.dm.clone_statuses()
        self.dm.device_sectors('/dev/vg/lv')
        self.dm.version()
        commands = [c.args for c in self.execute.call_args_list]
        self.assertEqual(8, len(commands))
        for cmd in commands:
            self.assertEqual(('/usr/bin/env', 'LC_ALL=C'), cmd[:2])
        self.assertEqual(['blockdev'] + ['dmsetup'] * 7,
                         sorted(cmd[2] for cmd in commands))

    def test_create_feeds_table_on_stdin(self):
        seg = dmsetup.linear_segment(0, 8, '/dev/vg/lv')
        self.dm.create('h', [seg], uuid='DMCLONE-h')
        self._assert_called('dmsetup', 'create', 'h', '--uuid', 'DMCLONE-h',
                            process_input='0 8 linear /dev/vg/lv 0\n')

    def test_create_validates_before_running(self):
        seg = dmsetup.linear_segment(0, 8, '/dev/vg/lv')
        self.assertRaises(exception.InvalidDMName, self.dm.create,
                          'bad name', [seg], uuid='u')
        self.assertRaises(exception.InvalidTable, self.dm.create,
                          'h', [], uuid='u')
        self.execute.assert_not_called()

    def test_load_suspend_resume(self):
        seg = dmsetup.linear_segment(0, 8, '/dev/vg/lv')
        self.dm.load('h', [seg])
        self._assert_called('dmsetup', 'load', 'h',
                            process_input='0 8 linear /dev/vg/lv 0\n')
        self.dm.suspend('h')
        self._assert_called('dmsetup', 'suspend', 'h')
        self.dm.suspend('h', flush=False)
        self._assert_called('dmsetup', 'suspend', 'h', '--noflush')
        self.dm.resume('h')
        self._assert_called('dmsetup', 'resume', 'h')

    def test_reload_order(self):
        # no separate suspend: resume swaps the tables under its own
        # suspend, so no process start happens while I/O is paused
        seg = dmsetup.linear_segment(0, 8, '/dev/vg/lv')
        self.dm.reload('h', [seg])
        self.assertEqual(['load', 'resume'],
                         [c.args[3] for c in self.execute.call_args_list])

    def test_reload_failed_resume_clears_resumes_and_raises(self):
        calls = []

        def fake(*args, **kwargs):
            calls.append(args[3])
            if args[3] == 'resume' and calls.count('resume') == 1:
                raise processutils.ProcessExecutionError(stderr='busy')
            return '', ''
        self.execute.side_effect = fake
        seg = dmsetup.linear_segment(0, 8, '/dev/vg/lv')
        self.assertRaises(exception.DMSetupCommandFailed, self.dm.reload,
                          'h', [seg])
        self.assertEqual(['load', 'resume', 'clear', 'resume'], calls)

    def test_reload_failed_resume_clear_and_second_resume(self):
        self.execute.side_effect = [
            ('', ''), processutils.ProcessExecutionError(stderr='busy'),
            processutils.ProcessExecutionError(stderr='no'),
            processutils.ProcessExecutionError(stderr='no')]
        seg = dmsetup.linear_segment(0, 8, '/dev/vg/lv')
        self.assertRaises(exception.DMSetupCommandFailed, self.dm.reload,
                          'h', [seg])
        self.assertEqual(4, self.execute.call_count)

    def test_message(self):
        self.dm.message('h', 'enable_hydration')
        self._assert_called('dmsetup', 'message', 'h', '0',
                            'enable_hydration')
        self.dm.message('h', 'hydration_batch_size', 16)
        self._assert_called('dmsetup', 'message', 'h', '0',
                            'hydration_batch_size', '16')

    def test_message_rejects_unknown(self):
        for words in ([], ['reboot'], ['hydration_threshold', '1; rm'],
                      ['hydration_threshold', '-1']):
            self.assertRaises(exception.InvalidDMName, self.dm.message,
                              'h', *words)
        self.execute.assert_not_called()

    def test_remove(self):
        self.dm.remove('h')
        self._assert_called('dmsetup', 'remove', '--retry', 'h')
        self.dm.remove('h', retry=False)
        self._assert_called('dmsetup', 'remove', 'h')

    def test_remove_already_gone_is_fine(self):
        self.execute.side_effect = processutils.ProcessExecutionError(
            exit_code=1,
            stderr='device-mapper: remove ioctl on h  failed: No such device '
                   'or address\nCommand failed.')
        self.dm.remove('h')

    @ddt.data(
        # rootwrap without the executable, or refusing the command
        (96, 'Executable not found: dmsetup (filter match = dmsetup_rm)'),
        (99, 'Unauthorized command: dmsetup remove h (no filter matched)'),
        # the kernel's device-mapper missing altogether
        (1, '/dev/mapper/control: open failed: No such device or address\n'
            'Failure to communicate with kernel device-mapper driver.\n'
            'Command failed.'),
        # the right message, but from something that did not exit 1
        (2, 'Device does not exist.'),
        (None, 'Device does not exist.'))
    @ddt.unpack
    def test_remove_other_not_found_errors_raise(self, code, stderr):
        self.execute.side_effect = processutils.ProcessExecutionError(
            exit_code=code, stderr=stderr)
        self.assertRaises(exception.DMSetupCommandFailed, self.dm.remove,
                          'h')

    def test_exists_message_on_stdout(self):
        self.execute.side_effect = processutils.ProcessExecutionError(
            exit_code=1, stdout='Device does not exist.\n',
            stderr='Command failed.\n')
        self.assertFalse(self.dm.exists('h'))

    def test_exists_rootwrap_not_found_raises(self):
        self.execute.side_effect = processutils.ProcessExecutionError(
            exit_code=96, stderr='Executable not found: dmsetup')
        self.assertRaises(exception.DMSetupCommandFailed, self.dm.exists,
                          'h')

    def test_exists_start_failure_raises(self):
        self.execute.side_effect = FileNotFoundError(
            2, 'No such file or directory: not found')
        self.assertRaises(exception.DMSetupCommandFailed, self.dm.exists,
                          'h')

    def test_listing_not_retried_when_rootwrap_lacks_dmsetup(self):
        self.execute.side_effect = processutils.ProcessExecutionError(
            exit_code=96, stderr='Executable not found: dmsetup')
        self.assertRaises(exception.DMSetupCommandFailed,
                          self.dm.clone_statuses)
        self.assertEqual(1, self.execute.call_count)

    def test_remove_busy_raises(self):
        self.execute.side_effect = processutils.ProcessExecutionError(
            stderr='device-mapper: remove ioctl on h failed: Device or '
                   'resource busy')
        exc = self.assertRaises(exception.DMSetupCommandFailed,
                                self.dm.remove, 'h')
        self.assertIn('Device or resource busy', str(exc))
        self.assertIn('dmsetup remove --retry h', str(exc))

    def test_exists(self):
        self.assertTrue(self.dm.exists('h'))
        self._assert_called('dmsetup', 'info', 'h')
        self.execute.side_effect = processutils.ProcessExecutionError(
            exit_code=1, stderr='Device does not exist.\nCommand failed.')
        self.assertFalse(self.dm.exists('h'))

    def test_exists_other_error_raises(self):
        self.execute.side_effect = processutils.ProcessExecutionError(
            stderr='Permission denied')
        self.assertRaises(exception.DMSetupCommandFailed, self.dm.exists,
                          'h')

    def test_status_and_table(self):
        self.execute.return_value = ('0 524288 clone %s\n' % CREATED, '')
        lines = self.dm.status('h')
        self._assert_called('dmsetup', 'status', 'h')
        self.assertEqual(4096, lines[0].clone.total_regions)
        self.execute.return_value = ('0 8 linear 253:1 0\n', '')
        self.assertEqual('linear', self.dm.table('h')[0].target)
        self._assert_called('dmsetup', 'table', 'h')

    def test_clone_statuses_one_command(self):
        self.execute.return_value = (
            'dmclone-a: 0 524288 clone %s\n'
            'dmclone-b: 0 524288 clone Fail\n' % HYDRATED, '')
        result = self.dm.clone_statuses()
        self.assertEqual(1, self.execute.call_count)
        self._assert_called('dmsetup', 'status', '--target', 'clone')
        self.assertTrue(result['dmclone-a'].fully_hydrated)
        self.assertTrue(result['dmclone-b'].failed)

    def test_clone_statuses_a_bad_line_costs_only_its_device(self):
        bad = 'dmclone-b: 0 524288 clone %s' % CREATED.replace(
            'no_hydration', 'new_feature')
        self.execute.return_value = (
            'dmclone-a: 0 524288 clone %s\n%s\n'
            'odd:name: 0 524288 clone %s\n' % (HYDRATED, bad, HYDRATED), '')
        log = self.useFixture(fixtures.FakeLogger(level=logging.WARNING))
        result = self.dm.clone_statuses()
        self.assertEqual(['dmclone-a', 'odd:name'], sorted(result))
        self.assertIn(bad, log.output)
        # a caller that asks for the errors logs them itself
        errors = {}
        log = self.useFixture(fixtures.FakeLogger(level=logging.WARNING))
        result = self.dm.clone_statuses(errors=errors)
        self.assertEqual(['dmclone-a', 'odd:name'], sorted(result))
        self.assertEqual(['dmclone-b'], list(errors))
        self.assertEqual('', log.output)

    def test_statuses_and_tables_collect_errors(self):
        self.execute.return_value = ('a: 0 8 linear \nb: x 8 linear \n', '')
        errors = {}
        self.assertEqual(['a'], list(self.dm.statuses(errors=errors)))
        self.assertEqual(['b'], list(errors))
        errors = {}
        self.assertEqual(['a'], list(self.dm.tables(errors=errors)))
        self.assertEqual(['b'], list(errors))

    def test_listing_again_when_a_device_vanished(self):
        # dmsetup lists, then queries each device: one removed in between
        # fails the whole command; the next listing no longer has it.
        gone = processutils.ProcessExecutionError(
            exit_code=1, stderr='Device does not exist.\nCommand failed.')
        self.execute.side_effect = [
            gone, ('dmclone-a: 0 524288 clone %s\n' % HYDRATED, '')]
        self.assertEqual(['dmclone-a'], list(self.dm.clone_statuses()))
        self.assertEqual(2, self.execute.call_count)

    @ddt.data('clone_statuses', 'statuses', 'tables', 'uuids')
    def test_listing_gives_up_after_three_vanishings(self, method):
        self.execute.side_effect = processutils.ProcessExecutionError(
            exit_code=1, stderr='Device does not exist.\nCommand failed.')
        self.assertRaises(exception.DMSetupCommandFailed,
                          getattr(self.dm, method))
        self.assertEqual(3, self.execute.call_count)

    def test_listing_other_errors_not_retried(self):
        self.execute.side_effect = processutils.ProcessExecutionError(
            stderr='Permission denied')
        self.assertRaises(exception.DMSetupCommandFailed,
                          self.dm.clone_statuses)
        self.assertEqual(1, self.execute.call_count)

    def test_clone_statuses_none(self):
        self.execute.return_value = ('No devices found\n', '')
        self.assertEqual({}, self.dm.clone_statuses())

    def test_statuses_of_every_device_in_one_command(self):
        self.execute.return_value = (
            'dmclone-vg-a: 0 524288 clone %s\n'
            'dmclone-vg-b: 0 8 linear \n'
            'vg-lv: 0 8 linear\n' % HYDRATED, '')
        result = self.dm.statuses()
        self.assertEqual(1, self.execute.call_count)
        self._assert_called('dmsetup', 'status')
        self.assertTrue(result['dmclone-vg-a'][0].clone.fully_hydrated)
        self.assertEqual('linear', result['dmclone-vg-b'][0].target)
        self.assertIsNone(result['vg-lv'][0].clone)
        self.execute.return_value = ('No devices found\n', '')
        self.assertEqual({}, self.dm.statuses())

    def test_tables_of_every_clone(self):
        self.execute.return_value = (
            'h1: 0 2048 clone 253:3 253:2 8:16 128 1 no_hydration\n'
            'h2: 0 2048 clone 253:5 253:4 8:32 128\n'
            'h2: 2048 8 linear 253:4 2048\n', '')
        tables = self.dm.tables('clone')
        self._assert_called('dmsetup', 'table', '--target', 'clone')
        self.assertEqual('8:16',
                         dmsetup.parse_clone_table(tables['h1'][0]).source_dev)
        self.assertEqual(['clone', 'linear'],
                         [s.target for s in tables['h2']])
        self.execute.return_value = ('', '')
        self.assertEqual({}, self.dm.tables())
        self._assert_called('dmsetup', 'table')

    def test_tables_refuses_odd_target(self):
        self.assertRaises(exception.InvalidDMName, self.dm.tables, 'a b')
        self.execute.assert_not_called()

    def test_uuids(self):
        self.execute.return_value = ('dmclone-vg-a|DMCLONE-dmclone-vg-a\n'
                                     'plain|\n', '')
        self.assertEqual({'dmclone-vg-a': 'DMCLONE-dmclone-vg-a',
                          'plain': ''}, self.dm.uuids())
        self._assert_called('dmsetup', 'info', '-c', '--noheadings', '-o',
                            'name,uuid', '--separator', '|')
        self.execute.return_value = ('No devices found\n', '')
        self.assertEqual({}, self.dm.uuids())
        self.execute.return_value = ('garbage\n', '')
        self.assertRaises(exception.DMStatusParseError, self.dm.uuids)

    def test_targets_and_version(self):
        self.execute.return_value = ('clone v1.0.0\nlinear v1.4.0\n', '')
        self.assertEqual({'clone': 'v1.0.0', 'linear': 'v1.4.0'},
                         self.dm.targets())
        self.execute.return_value = ('Library version: 1.02\n', '')
        self.assertIn('Library', self.dm.version())

    def test_missing_binary(self):
        self.execute.side_effect = FileNotFoundError(2, 'No such file',
                                                     'dmsetup')
        exc = self.assertRaises(exception.DMSetupCommandFailed,
                                self.dm.version)
        self.assertIn('No such file', str(exc))

    def test_device_sectors(self):
        self.execute.return_value = ('2097152\n', '')
        self.assertEqual(2097152, self.dm.device_sectors('/dev/vg/lv'))
        self._assert_called('blockdev', '--getsz', '/dev/vg/lv')

    def test_open_count(self):
        self.execute.return_value = (test_dmsetup.StatusTestCase.INFO, '')
        self.assertEqual(2, self.dm.open_count('dmclone-dmc--a-volume-1'))
        self._assert_called('dmsetup', 'info', 'dmclone-dmc--a-volume-1')

    def test_open_count_refuses_bad_name(self):
        self.assertRaises(exception.InvalidDMName, self.dm.open_count,
                          '../x')
        self.execute.assert_not_called()

    def test_device_sectors_garbage(self):
        self.execute.return_value = ('lots\n', '')
        self.assertRaises(exception.DMStatusParseError,
                          self.dm.device_sectors, '/dev/vg/lv')

    def test_device_sectors_refuses_bad_path(self):
        self.assertRaises(exception.InvalidDMName, self.dm.device_sectors,
                          '/etc/shadow')
        self.execute.assert_not_called()

    # -- failures told by exit status and exact message --------------------

    @ddt.data(
        ('status', (1, '', 'Device does not exist.\nCommand failed.\n')),
        ('table', (1, 'Device does not exist.\n', 'Command failed.\n')),
        ('suspend', (1, '', 'device-mapper: suspend ioctl on h  failed: '
                            'No such device or address\nCommand failed.\n')))
    @ddt.unpack
    def test_absent_device_is_dm_device_not_found(self, op, failure):
        code, out, err = failure
        self.execute.side_effect = processutils.ProcessExecutionError(
            exit_code=code, stdout=out, stderr=err)
        exc = self.assertRaises(exception.DMDeviceNotFound,
                                getattr(self.dm, op), 'h')
        self.assertIsInstance(exc, exception.DMSetupCommandFailed)
        self.assertEqual(1, exc.exit_code)

    @ddt.data(
        (2, 'Device does not exist.'),
        (1, 'Device does not exist. (maybe)'),
        (1, 'h: Device does not exist.'),
        (1, 'device-mapper: remove ioctl on h failed: Device or resource '
            'busy'))
    @ddt.unpack
    def test_near_misses_are_not_absent_devices(self, code, stderr):
        self.execute.side_effect = processutils.ProcessExecutionError(
            exit_code=code, stderr=stderr)
        exc = self.assertRaises(exception.DMSetupCommandFailed,
                                self.dm.status, 'h')
        self.assertNotIsInstance(exc, exception.DMDeviceNotFound)
        self.assertEqual(code, exc.exit_code)

    def test_rootwrap_refusal_of_a_dmsetup_command(self):
        self.execute.side_effect = processutils.ProcessExecutionError(
            exit_code=99, stderr='cinder-rootwrap: Unauthorized command: '
                                 '/usr/bin/env LC_ALL=C dmsetup resume h '
                                 '(no filter matched)\n')
        exc = self.assertRaises(exception.DMSetupCommandRefused,
                                self.dm.resume, 'h')
        # callers that handle any dmsetup failure still see one
        self.assertIsInstance(exc, exception.DMSetupCommandFailed)
        self.assertIsInstance(exc, exception.CommandRefused)
        self.assertEqual(99, exc.exit_code)
        self.assertIn('dmsetup resume h failed', str(exc))

    @ddt.data(
        # another command line than the one run
        (99, 'cinder-rootwrap: Unauthorized command: /usr/bin/env LC_ALL=C '
             'dmsetup resume other (no filter matched)'),
        # the command line without its LC_ALL=C prefix
        (99, 'cinder-rootwrap: Unauthorized command: dmsetup resume h '
             '(no filter matched)'),
        # the right line with another status
        (1, 'cinder-rootwrap: Unauthorized command: /usr/bin/env LC_ALL=C '
            'dmsetup resume h (no filter matched)'),
        # rootwrap's other refusal: a filter matched, no executable
        (96, 'cinder-rootwrap: Executable not found: /usr/bin/env (filter '
             'match = dmsetup_load)'))
    @ddt.unpack
    def test_other_failures_are_not_refusals(self, code, stderr):
        self.execute.side_effect = processutils.ProcessExecutionError(
            exit_code=code, stderr=stderr)
        exc = self.assertRaises(exception.DMSetupCommandFailed,
                                self.dm.resume, 'h')
        self.assertNotIsInstance(exc, exception.CommandRefused)

    def test_refusal_of_blockdev(self):
        self.execute.side_effect = processutils.ProcessExecutionError(
            exit_code=99, stderr='cinder-rootwrap: Unauthorized command: '
                                 '/usr/bin/env LC_ALL=C blockdev --getsz '
                                 '/dev/vg/lv (no filter matched)')
        self.assertRaises(exception.DMSetupCommandRefused,
                          self.dm.device_sectors, '/dev/vg/lv')

    def test_could_not_start_has_no_exit_code(self):
        self.execute.side_effect = FileNotFoundError(2, 'No such file',
                                                     'dmsetup')
        exc = self.assertRaises(exception.DMSetupCommandFailed,
                                self.dm.version)
        self.assertIsNone(exc.exit_code)

    def test_messages_are_checked_before_any_command(self):
        self.assertRaises(exception.InvalidDMName, self.dm.message, 'h',
                          'enable_hydration', 'now please')
        self.assertRaises(exception.InvalidDMName, self.dm.message, 'a b',
                          'enable_hydration')
        self.execute.assert_not_called()


META_PATH = '/dev/cinder-volumes/volume-1f2e3d4c-dmcmeta'
ROOT_HELPER = 'sudo cinder-rootwrap /etc/cinder/rootwrap.conf'


@ddt.ddt
class ZeroMetadataHeadTestCase(test.TestCase):
    """dd over the head of a clone's metadata LV."""

    def setUp(self):
        super().setUp()
        self.execute = mock.Mock(return_value=('', ''))

    def zero(self, path=META_PATH):
        privileged.zero_metadata_head(path, execute=self.execute,
                                      root_helper=ROOT_HELPER)

    def test_command(self):
        self.zero()
        self.execute.assert_called_once_with(
            '/usr/bin/env', 'LC_ALL=C', 'dd', 'if=/dev/zero',
            'of=' + META_PATH, 'bs=1M', 'count=1', 'oflag=direct',
            'conv=nocreat', run_as_root=True, root_helper=ROOT_HELPER)

    def test_default_execute_is_cinders(self):
        with mock.patch.object(privileged.utils, 'execute',
                               return_value=('', '')) as execute:
            privileged.zero_metadata_head(META_PATH)
        self.assertEqual(('/usr/bin/env', 'LC_ALL=C', 'dd'),
                         execute.call_args.args[:3])
        self.assertEqual({'run_as_root': True}, execute.call_args.kwargs)

    @ddt.data('/dev/vg/volume-1', '/dev/vg/volume-1-dmcmeta-x',
              '/dev/mapper/vg-volume--1-dmcmeta', '/dev/../x-dmcmeta',
              '/dev/./x-dmcmeta', '/dev/vg/../x-dmcmeta', '/dev/x-dmcmeta',
              '/dev/vg/sub/x-dmcmeta', 'dev/vg/x-dmcmeta',
              '/etc/vg/x-dmcmeta', '/dev/-vg/x-dmcmeta', '/dev/vg/-x-dmcmeta',
              '/dev/vg/x-dmcmeta ', '/dev/vg/a b-dmcmeta',
              '/dev/vg/x-dmcmeta\n', '', None, 7)
    def test_other_paths_are_refused_before_any_command(self, path):
        self.assertRaises(exception.InvalidDMName, self.zero, path)
        self.execute.assert_not_called()

    @ddt.data('/dev/cinder-volumes/volume-1-dmcmeta', '/dev/a/b-dmcmeta',
              '/dev/x.y+z_/volume-1-dmcmeta', '/dev/.vg/_x-dmcmeta',
              '/dev/vg/volume-1-dmcmeta-dmcmeta')
    def test_metadata_lv_paths(self, path):
        self.zero(path)
        self.assertIn('of=' + path, self.execute.call_args.args)

    def test_missing_device_node(self):
        # GNU dd under LC_ALL=C with conv=nocreat and no such path
        self.execute.side_effect = failure(
            1, "dd: failed to open '%s': No such file or directory\n"
               % META_PATH)
        exc = self.assertRaises(exception.DeviceNotFound, self.zero)
        self.assertEqual(1, exc.exit_code)
        self.assertIn('dd if=/dev/zero of=%s' % META_PATH, str(exc))
        self.assertIn('No such file or directory', str(exc))

    @ddt.data(
        # another path than the one zeroed
        (1, "dd: failed to open '/dev/vg/other-dmcmeta': No such file or "
            "directory"),
        # another reason
        (1, "dd: failed to open '%s': Permission denied" % META_PATH),
        (1, "dd: failed to open '%s': Invalid argument" % META_PATH),
        (1, "dd: error writing '%s': No space left on device\n1+0 records "
            "in\n0+0 records out" % META_PATH),
        # the message, but not from dd's failure status
        (2, "dd: failed to open '%s': No such file or directory"
            % META_PATH),
        # env itself: dd not installed
        (127, "/usr/bin/env: 'dd': No such file or directory"))
    @ddt.unpack
    def test_other_failures(self, code, stderr):
        self.execute.side_effect = failure(code, stderr)
        exc = self.assertRaises(exception.PrivilegedCommandFailed,
                                self.zero)
        self.assertIs(exception.PrivilegedCommandFailed, type(exc))
        self.assertEqual(code, exc.exit_code)

    def test_refused_by_rootwrap(self):
        self.execute.side_effect = failure(
            99, 'cinder-rootwrap: Unauthorized command: /usr/bin/env '
                'LC_ALL=C dd if=/dev/zero of=%s bs=1M count=1 oflag=direct '
                'conv=nocreat (no filter matched)\n' % META_PATH)
        exc = self.assertRaises(exception.CommandRefused, self.zero)
        self.assertEqual(99, exc.exit_code)
        self.assertNotIsInstance(exc, exception.DMSetupCommandFailed)

    def test_could_not_start(self):
        self.execute.side_effect = PermissionError(13, 'Permission denied')
        exc = self.assertRaises(exception.PrivilegedCommandFailed,
                                self.zero)
        self.assertIsNone(exc.exit_code)
        self.assertIn('Permission denied', str(exc))


KVER_DIR = '/lib/modules/6.1.0-13-amd64'


@ddt.ddt
class LoadModuleTestCase(test.TestCase):
    """modprobe of the clone target."""

    def setUp(self):
        super().setUp()
        self.execute = mock.Mock(return_value=('', ''))

    def load(self, name='dm_clone'):
        privileged.load_module(name, execute=self.execute,
                               root_helper=ROOT_HELPER)

    def test_command(self):
        self.load()
        self.execute.assert_called_once_with(
            '/usr/bin/env', 'LC_ALL=C', 'modprobe', 'dm_clone',
            run_as_root=True, root_helper=ROOT_HELPER)

    def test_no_root_helper_given(self):
        privileged.load_module('dm_clone', execute=self.execute)
        self.execute.assert_called_once_with(
            '/usr/bin/env', 'LC_ALL=C', 'modprobe', 'dm_clone',
            run_as_root=True)

    @ddt.data('dm_delay', 'dm-clone', 'dm_clone x=1', '-r', '', None,
              'dm_clone\n')
    def test_other_modules_are_refused_before_any_command(self, name):
        self.assertRaises(exception.InvalidDMName, self.load, name)
        self.execute.assert_not_called()

    def test_module_not_installed(self):
        # kmod's modprobe under LC_ALL=C (tools/modprobe.c, insmod())
        self.execute.side_effect = failure(
            1, 'modprobe: FATAL: Module dm_clone not found in directory '
               '%s\n' % KVER_DIR)
        exc = self.assertRaises(exception.KernelModuleNotFound, self.load)
        self.assertEqual(1, exc.exit_code)
        self.assertIn(KVER_DIR, str(exc))

    def test_module_not_installed_after_libkmod_errors(self):
        self.execute.side_effect = failure(
            1, "modprobe: ERROR: ../libkmod/libkmod.c:338 kmod_search_moddep"
               "() could not open moddep file '%s/modules.dep.bin'\n"
               "modprobe: FATAL: Module dm_clone not found in directory "
               "%s\n" % (KVER_DIR, KVER_DIR))
        self.assertRaises(exception.KernelModuleNotFound, self.load)

    @ddt.data('Operation not permitted',
              'Unknown symbol in module, or unknown parameter (see dmesg)',
              'Exec format error', 'Key was rejected by service')
    def test_kernel_refuses_the_module(self, reason):
        self.execute.side_effect = failure(
            1, "modprobe: ERROR: could not insert 'dm_clone': %s\n" % reason)
        exc = self.assertRaises(exception.KernelModuleRefused, self.load)
        self.assertIn(reason, str(exc))

    @ddt.data(
        # another module's messages
        (1, 'modprobe: FATAL: Module dm_delay not found in directory '
            + KVER_DIR),
        (1, "modprobe: ERROR: could not insert 'dm_delay': Exec format "
            "error"),
        # the messages with another status
        (2, 'modprobe: FATAL: Module dm_clone not found in directory '
            + KVER_DIR),
        (0, "modprobe: ERROR: could not insert 'dm_clone': Exec format "
            "error"),
        # not the whole line
        (1, 'modprobe: FATAL: Module dm_clone not found in directory '
            + KVER_DIR + ' (really)'),
        (1, 'note: modprobe: FATAL: Module dm_clone not found in directory '
            + KVER_DIR),
        # modprobe not installed
        (127, "/usr/bin/env: 'modprobe': No such file or directory"),
        # sudo refusing the root helper
        (1, 'sudo: a password is required'))
    @ddt.unpack
    def test_other_failures(self, code, stderr):
        self.execute.side_effect = failure(code, stderr)
        exc = self.assertRaises(exception.PrivilegedCommandFailed, self.load)
        self.assertIs(exception.PrivilegedCommandFailed, type(exc))

    def test_refused_by_rootwrap(self):
        self.execute.side_effect = failure(
            99, 'cinder-rootwrap: Unauthorized command: /usr/bin/env '
                'LC_ALL=C modprobe dm_clone (no filter matched)\n')
        exc = self.assertRaises(exception.CommandRefused, self.load)
        self.assertIn('Unauthorized command', str(exc))

    def test_message_on_standard_output_counts_too(self):
        self.execute.side_effect = failure(
            1, '', stdout='modprobe: FATAL: Module dm_clone not found in '
                          'directory %s\n' % KVER_DIR)
        self.assertRaises(exception.KernelModuleNotFound, self.load)


class KnownTestCase(test.TestCase):
    """A Known failure: exit status, then one whole line."""

    def test_matches_a_whole_stripped_line(self):
        known = privileged.Known(1, privileged._exactly('Gone.'),
                                 exception.DMDeviceNotFound)
        self.assertTrue(known.matches(failure(1, 'x\n  Gone.  \ny')))
        self.assertFalse(known.matches(failure(1, 'Gone. ok')))
        self.assertFalse(known.matches(failure(1, 'Gone')))
        self.assertFalse(known.matches(failure(2, 'Gone.')))
        self.assertFalse(known.matches(failure(None, 'Gone.')))
        self.assertFalse(known.matches(failure(1, None)))

    def test_exactly_escapes(self):
        self.assertIsNotNone(
            privileged._exactly('a.b (c)').fullmatch('a.b (c)'))
        self.assertIsNone(privileged._exactly('a.b').fullmatch('axb'))


class ThinLvsTestCase(test.TestCase):
    """The lvs of a volume group's thin pool and thin LVs."""

    def setUp(self):
        super().setUp()
        self.execute = mock.Mock(return_value=(
            '  vg-a-pool|10737418240|40.00|10.00|8388608|65536|\n'
            '  volume-1|1073741824|25.00|||0|vg-a-pool\n', ''))

    def test_command_and_result(self):
        lvs = privileged.thin_lvs('vg-a', execute=self.execute,
                                  root_helper='sudo cinder-rootwrap')
        self.execute.assert_called_once_with(
            '/usr/bin/env', 'LC_ALL=C', 'lvs', '--noheadings', '--nosuffix',
            '--units', 'b', '--separator', '|', '-o',
            'lv_name,lv_size,data_percent,metadata_percent,'
            'lv_metadata_size,chunk_size,pool_lv', 'vg-a', run_as_root=True,
            root_helper='sudo cinder-rootwrap')
        self.assertEqual(['vg-a-pool', 'volume-1'], sorted(lvs))
        self.assertEqual(268435456, lvs['volume-1'].allocated)

    def test_volume_group_name_is_checked_first(self):
        for bad in ('-o', '..', 'a b', 'vg;x', 'vg/pool', ''):
            self.assertRaises(exception.InvalidDMName, privileged.thin_lvs,
                              bad, execute=self.execute)
        self.execute.assert_not_called()

    def test_failure(self):
        self.execute.side_effect = failure(
            5, '  Volume group "nope" not found\n')
        exc = self.assertRaises(exception.PrivilegedCommandFailed,
                                privileged.thin_lvs, 'nope',
                                execute=self.execute)
        self.assertEqual(5, exc.exit_code)

    def test_unreadable_output(self):
        self.execute.return_value = ('  vg-a-pool|ten|40.00\n', '')
        self.assertRaises(exception.LVSParseError, privileged.thin_lvs,
                          'vg-a', execute=self.execute)


class VgLvNamesTestCase(test.TestCase):
    """The names of a group's LVs: thin_lvs's command, strictly."""

    def setUp(self):
        super().setUp()
        self.execute = mock.Mock(return_value=(
            '  vg-a-pool|10737418240|40.00|10.00|8388608|65536|\n'
            '  volume-1|1073741824|25.00|||0|vg-a-pool\n', ''))

    def test_names(self):
        self.assertEqual({'vg-a-pool', 'volume-1'}, privileged.vg_lv_names(
            'vg-a', execute=self.execute, root_helper='sudo'))
        self.assertEqual('vg-a', self.execute.call_args[0][-1])

    def test_a_group_not_found_is_no_empty_group(self):
        self.execute.side_effect = failure(
            5, '  Volume group "vg-a" not found\n'
            '  Cannot process volume group vg-a\n')
        self.assertRaises(exception.PrivilegedCommandFailed,
                          privileged.vg_lv_names, 'vg-a',
                          execute=self.execute)

    def test_an_empty_group(self):
        self.execute.return_value = ('', '')
        self.assertEqual(frozenset(), privileged.vg_lv_names(
            'vg-a', execute=self.execute))


class ListLvsTestCase(test.TestCase):
    """The lvs of cinder-dmclone."""

    def setUp(self):
        super().setUp()
        self.execute = mock.Mock(return_value=(
            '  vg-a|volume-1\n  meta|volume-1-dmcmeta\n\n  odd line\n',
            ''))

    def test_command_and_result(self):
        self.assertEqual({('vg-a', 'volume-1'), ('meta', 'volume-1-dmcmeta')},
                         privileged.list_lvs(['vg-a', 'meta'],
                                             execute=self.execute))
        # the tool runs as root itself: no root helper
        self.execute.assert_called_once_with(
            '/usr/bin/env', 'LC_ALL=C', 'lvs', '--noheadings', '--separator',
            '|', '-o', 'vg_name,lv_name', 'vg-a', 'meta', run_as_root=False)

    def test_every_volume_group(self):
        privileged.list_lvs([], execute=self.execute)
        self.assertEqual(('/usr/bin/env', 'LC_ALL=C', 'lvs', '--noheadings',
                          '--separator', '|', '-o', 'vg_name,lv_name'),
                         self.execute.call_args.args)

    def test_volume_group_names_are_checked_first(self):
        for bad in ('-o', '..', 'a b', 'vg;x', ''):
            self.assertRaises(exception.InvalidDMName, privileged.list_lvs,
                              [bad], execute=self.execute)
        self.execute.assert_not_called()

    def test_failure(self):
        self.execute.side_effect = failure(
            5, '  Volume group "nope" not found\n')
        exc = self.assertRaises(exception.PrivilegedCommandFailed,
                                privileged.list_lvs, ['nope'],
                                execute=self.execute)
        self.assertEqual(5, exc.exit_code)
        self.assertIn('Volume group "nope" not found', str(exc))


class OneCommandLayerTestCase(test.TestCase):
    """No module but privileged.py runs a command itself."""

    PACKAGE = os.path.dirname(os.path.abspath(privileged.__file__))
    #: Cinder's and oslo's execute, subprocess's and os's ways to run one
    RUNNERS = ('execute', '_execute', 'Popen', 'check_output', 'check_call',
               'system')

    def _calls_to_execute(self, path):
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = (func.attr if isinstance(func, ast.Attribute)
                    else getattr(func, 'id', None))
            if name in self.RUNNERS:
                yield '%s:%d' % (os.path.relpath(path, self.PACKAGE),
                                 node.lineno)

    def test_only_privileged_runs_commands(self):
        found = []
        for root, _dirs, files in os.walk(self.PACKAGE):
            for name in sorted(files):
                path = os.path.join(root, name)
                if name.endswith('.py') and path != privileged.__file__:
                    found.extend(self._calls_to_execute(path))
        self.assertEqual([], found)

    def test_the_check_sees_a_call(self):
        # (_run's, and _pieces_of's for a streamed command run by a
        # caller's execute.)
        calls = list(self._calls_to_execute(privileged.__file__))
        self.assertEqual(2, len(calls))


class LioOpenersTestCase(test.TestCase):
    """LIO's block backstores holding a device, read from configfs."""

    def setUp(self):
        super().setUp()
        self.root = self.useFixture(fixtures.TempDir()).path
        self.core = os.path.join(self.root, 'core')
        self.device = os.path.join(self.root, 'dm-3')
        open(self.device, 'w').close()
        self.alias = os.path.join(self.root, 'mapper-handle')
        os.symlink(self.device, self.alias)
        other = os.path.join(self.root, 'dm-4')
        open(other, 'w').close()
        self.backstore('iblock_0', 'vol-1', self.alias, '1')
        self.backstore('iblock_1', 'vol-2', other, '1')

    def backstore(self, hba, name, udev_path, enable):
        so = os.path.join(self.core, hba, name)
        os.makedirs(so)
        with open(os.path.join(so, 'udev_path'), 'w') as f:
            f.write(udev_path + '\n')
        with open(os.path.join(so, 'enable'), 'w') as f:
            f.write(enable + '\n')

    def count(self, device=None):
        return privileged.lio_openers(device or self.device, core=self.core)

    def test_one_backstore_over_the_device_under_another_name(self):
        self.assertEqual(1, self.count())
        self.assertEqual(1, self.count(self.alias))

    def test_a_disabled_backstore_holds_nothing(self):
        self.backstore('iblock_2', 'vol-3', self.device, '0')
        self.assertEqual(1, self.count())
        self.backstore('iblock_3', 'vol-4', self.device, '1')
        self.assertEqual(2, self.count())

    def test_no_lio_or_no_device(self):
        self.assertEqual(0, privileged.lio_openers(
            self.device, core=os.path.join(self.root, 'absent')))
        self.assertEqual(0, self.count(os.path.join(self.root, 'gone')))

    def test_a_backstore_over_a_vanished_device_is_skipped(self):
        self.backstore('iblock_2', 'vol-3', os.path.join(self.root, 'gone'),
                       '1')
        self.assertEqual(1, self.count())


@ddt.ddt
class LioAclsTestCase(test.TestCase):
    """The initiators an iSCSI target admits, read from configfs."""

    TARGET = 'iqn.2024-01.org.example.nodea:volume-1'

    def setUp(self):
        super().setUp()
        self.root = self.useFixture(fixtures.TempDir()).path
        self.acl(self.TARGET, 'tpgt_1', 'iqn.1993-08.org.debian:01:node-b')
        # Another volume's target admits another node: not counted.
        self.acl('iqn.2024-01.org.example.nodea:volume-2', 'tpgt_1',
                 'iqn.1993-08.org.debian:01:node-c')

    def acl(self, target, tpg, initiator):
        os.makedirs(os.path.join(self.root, target, tpg, 'acls', initiator))

    def acls(self, target=TARGET):
        return privileged.lio_acls(target, root=self.root)

    def test_the_targets_initiators(self):
        self.assertEqual({'iqn.1993-08.org.debian:01:node-b'}, self.acls())

    def test_every_portal_group_counts_and_names_compare_lowercase(self):
        self.acl(self.TARGET, 'tpgt_2', 'IQN.1993-08.org.debian:01:Node-C')
        self.assertEqual({'iqn.1993-08.org.debian:01:node-b',
                          'iqn.1993-08.org.debian:01:node-c'}, self.acls())

    def test_no_such_target_or_no_lio(self):
        self.assertEqual(frozenset(), self.acls(self.TARGET + '9'))
        self.assertEqual(frozenset(), privileged.lio_acls(
            self.TARGET, root=os.path.join(self.root, 'absent')))

    def test_glob_characters_are_literal(self):
        self.assertEqual(frozenset(),
                         self.acls('iqn.2024-01.org.example.nodea:volume-*'))

    @ddt.data('', '.', '..', '../iqn.x', 'iqn.x/tpgt_1')
    def test_not_a_target_name(self, name):
        self.assertRaises(ValueError, self.acls, name)

    def test_target_exists(self):
        self.assertTrue(privileged.lio_target_exists(self.TARGET,
                                                     root=self.root))
        self.assertFalse(privileged.lio_target_exists(self.TARGET + '9',
                                                      root=self.root))
        self.assertFalse(privileged.lio_target_exists(
            self.TARGET, root=os.path.join(self.root, 'absent')))

    @ddt.data('', '.', '..', '../iqn.x')
    def test_target_exists_refuses_a_path(self, name):
        self.assertRaises(ValueError, privileged.lio_target_exists, name,
                          root=self.root)


class SwapTestCase(test.TestCase):
    """DMSetup.swap: suspend, then load and resume (or resume only)."""

    def setUp(self):
        super().setUp()
        self.execute = mock.Mock(return_value=('', ''))
        self.dm = privileged.DMSetup(execute=self.execute)

    def _commands(self):
        return [c[0][2:4] for c in self.execute.call_args_list]

    def test_suspend_load_resume(self):
        self.assertTrue(self.dm.swap('h', [dmsetup.error_segment(0, 8)]))
        self.assertEqual([('dmsetup', 'suspend'), ('dmsetup', 'load'),
                          ('dmsetup', 'resume')], self._commands())
        self.assertEqual('0 8 error\n',
                         self.execute.call_args_list[1][1]['process_input'])

    def test_check_runs_while_suspended(self):
        seen = []

        def check():
            seen.append(self._commands())
            return False
        self.assertFalse(self.dm.swap('h', [dmsetup.error_segment(0, 8)],
                                      check=check))
        self.assertEqual([[('dmsetup', 'suspend')]], seen)
        self.assertEqual([('dmsetup', 'suspend'), ('dmsetup', 'resume')],
                         self._commands())

    def test_a_refused_table_resumes_the_old_one(self):
        def execute(*cmd, **kwargs):
            if cmd[3] == 'load':
                raise processutils.ProcessExecutionError(
                    exit_code=1, stderr='device-mapper: reload ioctl failed')
            return '', ''
        self.execute.side_effect = execute
        self.assertRaises(exception.DMSetupCommandFailed, self.dm.swap, 'h',
                          [dmsetup.error_segment(0, 8)])
        self.assertEqual([('dmsetup', 'suspend'), ('dmsetup', 'load'),
                          ('dmsetup', 'clear'), ('dmsetup', 'resume')],
                         self._commands())


class ProbeAndZeroTestCase(test.TestCase):

    def test_probe_reports_the_regions_that_fail_with_eio(self):
        import errno
        offsets = []

        def preadv(fd, bufs, offset):
            offsets.append(offset)
            if offset // 65536 in (1, 3):
                raise OSError(errno.EIO, 'Input/output error')
            return 4096
        self.mock_object(privileged.os, 'open', return_value=7)
        self.mock_object(privileged.os, 'close')
        self.mock_object(privileged.os, 'preadv', side_effect=preadv)
        self.assertEqual([1, 3], privileged.probe_regions('/dev/x', 65536,
                                                          5))
        self.assertEqual([0, 65536, 131072, 196608, 262144], offsets)
        privileged.os.open.assert_called_once_with(
            '/dev/x', os.O_RDONLY | os.O_DIRECT)

    def test_probe_raises_other_errors(self):
        import errno
        self.mock_object(privileged.os, 'open', return_value=7)
        self.mock_object(privileged.os, 'close')
        self.mock_object(privileged.os, 'preadv',
                         side_effect=OSError(errno.EINVAL, 'bad'))
        self.assertRaises(OSError, privileged.probe_regions, '/dev/x',
                          65536, 2)
        privileged.os.close.assert_called_once_with(7)

    def test_zero_ranges(self):
        import struct
        self.mock_object(privileged.os, 'open', return_value=7)
        self.mock_object(privileged.os, 'close')
        fsync = self.mock_object(privileged.os, 'fsync')
        ioctl = self.mock_object(privileged.fcntl, 'ioctl')
        privileged.zero_ranges('/dev/x', [(0, 65536), (1 << 20, 4096)])
        self.assertEqual(
            [mock.call(7, 0x127f, struct.pack('=QQ', 0, 65536)),
             mock.call(7, 0x127f, struct.pack('=QQ', 1 << 20, 4096))],
            ioctl.call_args_list)
        fsync.assert_called_once_with(7)
        self.assertRaises(ValueError, privileged.zero_ranges, '/dev/x',
                          [(100, 512)])

    def test_iscsi_session_states(self):
        root = self.useFixture(fixtures.TempDir()).path
        for name, iqn, state in (('session1', 'iqn.x:a', 'FAILED'),
                                 ('session2', 'iqn.x:b', 'LOGGED_IN'),
                                 ('session3', 'iqn.x:a', 'LOGGED_IN')):
            os.makedirs(os.path.join(root, name))
            for leaf, text in (('targetname', iqn), ('state', state)):
                with open(os.path.join(root, name, leaf), 'w') as f:
                    f.write(text + '\n')
        self.assertEqual({'session1': 'FAILED', 'session3': 'LOGGED_IN'},
                         privileged.iscsi_session_states('iqn.x:a', root))
        self.assertEqual({}, privileged.iscsi_session_states('iqn.x:c',
                                                             root))


XML = ('<superblock uuid="" time="0" transaction="1" flags="0" version="2" '
       'data_block_size="128" nr_data_blocks="100">\n'
       '  <device dev_id="3" mapped_blocks="2" transaction="0" '
       'creation_time="0" snap_time="0">\n'
       '    <range_mapping origin_begin="4" data_begin="0" length="2" '
       'time="0"/>\n'
       '  </device>\n</superblock>\n')


@ddt.ddt
class ThinMapCommandsTestCase(test.TestCase):
    """A thin LV's map (lvs, metadata snapshot, thin_dump), discards."""

    def setUp(self):
        super().setUp()
        self.execute = mock.Mock(return_value=('', ''))
        self.kw = dict(execute=self.execute, root_helper='sudo rw')

    def _called(self, *args):
        self.execute.assert_called_with(*privileged.ENV_PREFIX, *args,
                                        run_as_root=True,
                                        root_helper='sudo rw')

    def test_thin_device(self):
        self.execute.return_value = ('  7|cinder-volumes-pool\n', '')
        self.assertEqual((7, 'cinder-volumes-pool'), privileged.thin_device(
            'cinder-volumes', 'volume-1', **self.kw))
        self._called('lvs', '--noheadings', '--separator', '|', '-o',
                     'thin_id,pool_lv', 'cinder-volumes/volume-1')

    @ddt.data('  |\n', '', '  1|p\n  2|p\n', '  x|p\n', '  1|\n', '1\n')
    def test_thin_device_not_thin(self, out):
        self.execute.return_value = (out, '')
        self.assertRaises(exception.LVSParseError, privileged.thin_device,
                          'vg', 'lv', **self.kw)

    def test_thin_device_names_are_checked_first(self):
        for vg, lv in (('vg/x', 'lv'), ('vg', '../lv'), ('-o', 'lv'),
                       ('vg', 'a b')):
            self.assertRaises(exception.InvalidDMName,
                              privileged.thin_device, vg, lv, **self.kw)
        self.execute.assert_not_called()

    def test_reserve_and_release(self):
        privileged.reserve_metadata_snap('cinder-volumes',
                                         'cinder-volumes-pool', **self.kw)
        self._called('dmsetup', 'message',
                     'cinder--volumes-cinder--volumes--pool-tpool', '0',
                     'reserve_metadata_snap')
        self.assertTrue(privileged.release_metadata_snap(
            'cinder-volumes', 'cinder-volumes-pool', **self.kw))
        self._called('dmsetup', 'message',
                     'cinder--volumes-cinder--volumes--pool-tpool', '0',
                     'release_metadata_snap')

    def test_reserve_when_one_is_held(self):
        self.execute.side_effect = failure(
            1, 'device-mapper: message ioctl on vg-pool-tpool  failed: '
               'Device or resource busy\nCommand failed.\n')
        self.assertRaises(exception.MetadataSnapBusy,
                          privileged.reserve_metadata_snap, 'vg', 'pool',
                          **self.kw)

    def test_release_when_none_is_held(self):
        self.execute.side_effect = failure(
            1, 'device-mapper: message ioctl on vg-pool-tpool  failed: '
               'Invalid argument\nCommand failed.\n')
        self.assertFalse(privileged.release_metadata_snap('vg', 'pool',
                                                          **self.kw))

    @ddt.data(
        # another device's refusal, another error, rootwrap's absence
        'device-mapper: message ioctl on vg-other-tpool  failed: '
        'Invalid argument',
        'device-mapper: message ioctl on vg-pool-tpool  failed: '
        'Operation not supported',
        'Executable not found: dmsetup')
    def test_other_failures_are_failures(self, stderr):
        self.execute.side_effect = failure(1, stderr)
        exc = self.assertRaises(exception.DMSetupCommandFailed,
                                privileged.release_metadata_snap, 'vg',
                                'pool', **self.kw)
        self.assertNotIsInstance(exc, exception.MetadataSnapNotHeld)

    def test_pool_without_thin_lvs_is_not_found(self):
        self.execute.side_effect = failure(
            1, 'device-mapper: message ioctl on vg-pool-tpool  failed: No '
               'such device or address')
        self.assertRaises(exception.DMDeviceNotFound,
                          privileged.reserve_metadata_snap, 'vg', 'pool',
                          **self.kw)

    def test_pool_zeroes(self):
        self.execute.return_value = (
            '0 2097152 thin-pool 253:1 253:2 128 0 0\n', '')
        self.assertTrue(privileged.pool_zeroes(
            'cinder-volumes', 'cinder-volumes-pool', **self.kw))
        self._called('dmsetup', 'table',
                     'cinder--volumes-cinder--volumes--pool-tpool')
        self.execute.return_value = (
            '0 2097152 thin-pool 253:1 253:2 128 0 1 skip_block_zeroing\n',
            '')
        self.assertFalse(privileged.pool_zeroes('vg', 'pool', **self.kw))

    def test_pool_zeroes_of_no_pool(self):
        self.execute.side_effect = failure(
            1, 'Device does not exist.\nCommand failed.\n')
        self.assertRaises(exception.DMDeviceNotFound,
                          privileged.pool_zeroes, 'vg', 'pool', **self.kw)

    def test_pool_zeroes_names_are_checked_first(self):
        for vg, pool in (('vg/x', 'pool'), ('vg', '../p'), ('vg', 'a b')):
            self.assertRaises(exception.InvalidDMName,
                              privileged.pool_zeroes, vg, pool, **self.kw)
        self.execute.assert_not_called()

    def test_thin_table(self):
        self.execute.return_value = ('0 2097152 thin 253:3 7\n', '')
        [segment] = privileged.thin_table('cinder-volumes', 'volume-1',
                                          **self.kw)
        self.assertEqual(('253:3', '7'), segment.args)
        self._called('dmsetup', 'table', 'cinder--volumes-volume--1')
        for vg, lv in (('vg/x', 'lv'), ('vg', '../lv'), ('vg', 'a b')):
            self.assertRaises(exception.InvalidDMName,
                              privileged.thin_table, vg, lv, **self.kw)

    def test_thin_dump(self):
        self.execute.return_value = (XML, '')
        m = privileged.thin_dump('cinder-volumes', 'cinder-volumes-pool', 3,
                                 **self.kw)
        self.assertEqual(((4, 6),), m.ranges)
        self._called('thin_dump', '--format', 'xml', '--metadata-snap',
                     '--dev-id', '3',
                     '/dev/mapper/cinder--volumes-cinder--volumes--pool'
                     '_tmeta')

    def test_thin_dump_of_another_device_fails(self):
        self.execute.return_value = (XML, '')
        self.assertRaises(exception.ThinDumpParseError, privileged.thin_dump,
                          'vg', 'pool', 4, **self.kw)

    def test_thin_dump_arguments_are_checked_first(self):
        for vg, pool, dev in (('vg', 'pool', -1), ('vg', 'pool', '3'),
                              ('vg', 'pool', True), ('vg/x', 'pool', 1),
                              ('vg', '../p', 1)):
            self.assertRaises(exception.InvalidDMName, privileged.thin_dump,
                              vg, pool, dev, **self.kw)
        self.execute.assert_not_called()

    def test_thin_dump_failure(self):
        self.execute.side_effect = failure(1, 'no current metadata snap')
        self.assertRaises(exception.PrivilegedCommandFailed,
                          privileged.thin_dump, 'vg', 'pool', 1, **self.kw)

    def test_discard_regions(self):
        privileged.discard_regions('vg-a', 'volume-1', [(0, 128),
                                                        (1024, 2048)],
                                   **self.kw)
        path = '/dev/mapper/dmclone-vg--a-volume-1'
        self.assertEqual([
            mock.call(*privileged.ENV_PREFIX, 'blkdiscard', '--force',
                      '--offset', '0', '--length', '65536', path,
                      run_as_root=True, root_helper='sudo rw'),
            mock.call(*privileged.ENV_PREFIX, 'blkdiscard', '--force',
                      '--offset', '524288', '--length', '1048576', path,
                      run_as_root=True, root_helper='sudo rw')],
            self.execute.call_args_list)

    def test_zero_regions(self):
        privileged.discard_regions('vg', 'lv', [(8, 8)], zero=True,
                                   **self.kw)
        self._called('blkdiscard', '--zeroout', '--force', '--offset',
                     '4096', '--length', '4096', '/dev/mapper/dmclone-vg-lv')

    @ddt.data([(0, 0)], [(-8, 8)], [(0, '8')], [(True, 8)], [(0, 8), (8, -1)])
    def test_bad_ranges_run_nothing(self, ranges):
        self.assertRaises(exception.InvalidTable, privileged.discard_regions,
                          'vg', 'lv', ranges, **self.kw)
        self.execute.assert_not_called()

    def test_nothing_to_discard(self):
        privileged.discard_regions('vg', 'lv', [], **self.kw)
        self.execute.assert_not_called()

    def test_thin_mapped_sectors(self):
        self.execute.return_value = ('0 2097152 thin 1024 4095\n', '')
        self.assertEqual(1024, privileged.thin_mapped_sectors(
            'cinder-volumes', 'volume-1', **self.kw))
        self._called('dmsetup', 'status', 'cinder--volumes-volume--1')

    def test_pool_block_sectors(self):
        self.execute.return_value = (
            '0 2097152 thin-pool 253:1 253:2 512 0 0\n', '')
        self.assertEqual(512, privileged.pool_block_sectors(
            'cinder-volumes', 'cinder-volumes-pool', **self.kw))
        self._called('dmsetup', 'table',
                     'cinder--volumes-cinder--volumes--pool-tpool')


class StreamedThinDumpTestCase(test.TestCase):
    """thin_dump read as it comes, never more than its cap (R11-7)."""

    def setUp(self):
        super().setUp()
        self.calls = []
        self.closed = []

    def stream(self, *pieces, error=None):
        def run(*argv, **kwargs):
            self.calls.append((argv, kwargs))
            try:
                for piece in pieces:
                    yield piece
                if error is not None:
                    raise error
            finally:
                self.closed.append(True)
        return run

    def test_pieces_are_parsed_as_they_come(self):
        text = XML.encode()
        stream = self.stream(text[:50], text[50:120], text[120:])
        m = privileged.thin_dump('cinder-volumes', 'cinder-volumes-pool', 3,
                                 root_helper='sudo rw', stream=stream)
        self.assertEqual(((4, 6),), m.ranges)
        self.assertEqual([((*privileged.ENV_PREFIX, 'thin_dump', '--format',
                            'xml', '--metadata-snap', '--dev-id', '3',
                            '/dev/mapper/cinder--volumes-cinder--volumes--'
                            'pool_tmeta'),
                           {'run_as_root': True, 'root_helper': 'sudo rw'})],
                         self.calls)
        self.assertEqual([True], self.closed)

    def test_output_beyond_the_cap_is_not_read(self):
        text = XML.encode()
        pieces = [text[:40], text[40:80], text[80:]]
        stream = self.stream(*pieces)
        self.assertRaises(exception.ThinDumpTooLarge, privileged.thin_dump,
                          'vg', 'pool', 3, stream=stream, max_bytes=79)
        # (The runner was closed: it stops the command.)
        self.assertEqual([True], self.closed)

    def test_a_failed_dump_is_a_command_failure(self):
        stream = self.stream(XML.encode()[:20], error=failure(
            1, 'bad checksum in superblock'))
        exc = self.assertRaises(exception.PrivilegedCommandFailed,
                                privileged.thin_dump, 'vg', 'pool', 3,
                                stream=stream)
        self.assertIn('bad checksum in superblock', str(exc))

    def test_refused_by_rootwrap(self):
        argv = (*privileged.ENV_PREFIX, 'thin_dump', '--format', 'xml',
                '--metadata-snap', '--dev-id', '3',
                '/dev/mapper/vg-pool_tmeta')
        stream = self.stream(error=failure(
            99, 'cinder-rootwrap: Unauthorized command: %s (no filter '
            'matched)' % ' '.join(argv)))
        self.assertRaises(exception.CommandRefused, privileged.thin_dump,
                          'vg', 'pool', 3, stream=stream)

    def test_a_whole_output_runner_still_works(self):
        # (execute without a stream: its output in pieces, capped alike.)
        execute = mock.Mock(return_value=(XML, ''))
        self.assertEqual(((4, 6),), privileged.thin_dump(
            'vg', 'pool', 3, execute=execute).ranges)
        self.assertRaises(exception.ThinDumpTooLarge, privileged.thin_dump,
                          'vg', 'pool', 3, execute=execute, max_bytes=100)


class StreamOutputTestCase(test.TestCase):
    """The process runner behind a streamed command, on real processes."""

    def test_output_in_pieces(self):
        pieces = list(privileged.stream_output(
            'printf', 'abcdefghij', run_as_root=False, piece=4))
        self.assertEqual(b'abcdefghij', b''.join(pieces))
        self.assertTrue(all(len(p) <= 4 for p in pieces))

    def test_a_failure_raises_with_its_stderr(self):
        exc = self.assertRaises(
            processutils.ProcessExecutionError, list,
            privileged.stream_output('sh', '-c', 'echo out; echo bad >&2; '
                                     'exit 3', run_as_root=False))
        self.assertEqual(3, exc.exit_code)
        self.assertEqual('bad\n', exc.stderr)

    def test_closing_stops_a_command_that_never_ends(self):
        # (yes writes forever: only the closed pipe, or a signal, ends it.)
        procs = []

        def popen(*args, **kwargs):
            procs.append(subprocess.Popen(*args, **kwargs))
            return procs[-1]
        pieces = privileged.stream_output('yes', run_as_root=False,
                                          piece=4096, popen=popen)
        self.assertEqual(4096, len(next(pieces)))
        pieces.close()
        self.assertIsNotNone(procs[0].poll())

    def test_as_root_through_the_helper(self):
        self.mock_object(privileged.os, 'geteuid', return_value=1000)
        popen = mock.Mock(side_effect=OSError('no such file'))
        self.assertRaises(OSError, list, privileged.stream_output(
            '/usr/bin/env', 'LC_ALL=C', 'thin_dump', run_as_root=True,
            root_helper='sudo cinder-rootwrap /etc/cinder/rootwrap.conf',
            popen=popen))
        self.assertEqual(['sudo', 'cinder-rootwrap',
                          '/etc/cinder/rootwrap.conf', '/usr/bin/env',
                          'LC_ALL=C', 'thin_dump'], popen.call_args[0][0])

    def test_as_root_needs_a_helper(self):
        self.mock_object(privileged.os, 'geteuid', return_value=1000)
        self.assertRaises(processutils.NoRootWrapSpecified, list,
                          privileged.stream_output('true', run_as_root=True))

    def test_root_already_runs_it_itself(self):
        # (cinder-dmclone move abandon-source, run as root: no sudo, as
        # processutils.execute does for euid 0.)
        self.mock_object(privileged.os, 'geteuid', return_value=0)
        popen = mock.Mock(side_effect=OSError('no such file'))
        self.assertRaises(OSError, list, privileged.stream_output(
            '/usr/bin/env', 'LC_ALL=C', 'thin_dump', run_as_root=True,
            root_helper='sudo', popen=popen))
        self.assertEqual(['/usr/bin/env', 'LC_ALL=C', 'thin_dump'],
                         popen.call_args[0][0])
