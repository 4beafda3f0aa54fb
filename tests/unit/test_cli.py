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

"""cinder-dmclone: its commands, their output formats and exit statuses.

The node is the canned one of tests/unit/cli_fakes.py; what the report
holds is tests/unit/test_status.py's concern.
"""

import configparser
import csv
import importlib.metadata
import io
import json
import logging
import os
import sys
from unittest import mock

from oslo_concurrency import processutils
import yaml

from cinder_dmclone.cmd import cli
from cinder_dmclone.cmd import status
from tests.unit.cli_fakes import CLITestCase
from tests.unit.cli_fakes import clone_status
from tests.unit.cli_fakes import FakeNode
from tests.unit.cli_fakes import H1
from tests.unit.cli_fakes import H2
from tests.unit.cli_fakes import H3
from tests.unit.cli_fakes import LVS
from tests.unit.cli_fakes import status_text
from tests.unit.cli_fakes import U1
from tests.unit.cli_fakes import U2
from tests.unit.cli_fakes import U3
from tests.unit.cli_fakes import U4

SCOPE = ['--volume-group', 'cinder-volumes',
         '--metadata-volume-group', 'meta']
REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
RETIRING = 'volume-%s-dmcwipe-0a1b2c3d' % U1


def healthy_node(**kwargs):
    """H1 (linear) and H2 (cloning), nothing left over."""
    text = '\n'.join(status_text(256).splitlines()[:2]) + '\n'
    lvs = ('  cinder-volumes|volume-%s\n  cinder-volumes|volume-%s\n'
           '  meta|volume-%s-dmcmeta\n' % (U1, U2, U2))
    return FakeNode(statuses=[text, text], lvs=kwargs.pop('lvs', lvs),
                    **kwargs)


class CommandTreeTestCase(CLITestCase):

    def test_setup_cfg_registers_the_commands(self):
        parser = configparser.ConfigParser()
        parser.read(os.path.join(REPO, 'setup.cfg'))
        entry_points = parser['entry_points']
        registered = dict(
            line.split(' = ') for line in
            entry_points[cli.NAMESPACE].strip().splitlines())
        self.assertEqual(
            {cls.command_name.replace(' ', '_'):
             'cinder_dmclone.cmd.cli:%s' % cls.__name__
             for cls in cli.COMMANDS}, registered)
        scripts = dict(line.split(' = ') for line in
                       entry_points['console_scripts'].strip().splitlines())
        self.assertEqual('cinder_dmclone.cmd.cli:main',
                         scripts['cinder-dmclone'])
        self.assertEqual('cinder_dmclone.cmd.cli:status_alias',
                         scripts['cinder-dmclone-status'])

    def test_commands_without_entry_points(self):
        # A source tree on PYTHONPATH: nothing registered, COMMANDS added.
        manager = cli.CommandManager('cinder_dmclone.test.nothing')
        self.assertEqual({'status', 'handle list', 'move list',
                          'leftover list', 'move abandon-source'},
                         {name for name, _ep in manager})
        self.assertIs(cli.MoveList,
                      manager.find_command(['move', 'list'])[0])

    def test_entry_points_come_first(self):
        class Other(cli.Status):
            pass

        def load(manager, namespace):
            manager.add_command('status', Other)
        with mock.patch('cliff.commandmanager.CommandManager.load_commands',
                        load):
            manager = cli.CommandManager()
        self.assertIs(Other, manager.find_command(['status'])[0])
        self.assertIs(cli.HandleList,
                      manager.find_command(['handle', 'list'])[0])

    def test_help_lists_the_commands(self):
        code, out, err = self.run_cli(['help'])
        self.assertEqual(0, code)
        for name in ('status', 'handle list', 'move list', 'leftover list'):
            self.assertIn('  %s ' % name, out)
        self.assertIn('usage: cinder-dmclone', out)

    def test_help_of_a_command(self):
        for argv in (['help', 'move', 'list'], ['move', 'list', '--help']):
            code, out, err = self.run_cli(argv)
            self.assertEqual(0, code, argv)
            self.assertIn('usage: cinder-dmclone move list', out)
            self.assertIn('--interval', out)
            self.assertIn('--long', out)
        code, out, err = self.run_cli(['help', 'leftover', 'list'])
        self.assertNotIn('--interval', out)
        self.assertNotIn('--no-db', out)

    def test_no_command(self):
        for argv in ([], ['--debug']):
            code, out, err = self.run_cli(argv)
            self.assertEqual(2, code)
            self.assertIn('no command given', err)

    def test_unknown_command(self):
        code, out, err = self.run_cli(['nosuch'])
        self.assertEqual(2, code)

    def test_bad_option_exits_2(self):
        for argv in (['status', '--bogus'], ['status', '-f', 'csv'],
                     ['handle', 'list', '--interval', '1']):
            with mock.patch('sys.stderr', new_callable=io.StringIO):
                exc = self.assertRaises(SystemExit, self.run_cli, argv)
            self.assertEqual(2, exc.code, argv)

    def test_version(self):
        with mock.patch.object(importlib.metadata, 'version',
                               return_value='1.2.3'):
            self.assertEqual('1.2.3', cli.version())
        with mock.patch.object(
                importlib.metadata, 'version',
                side_effect=importlib.metadata.PackageNotFoundError):
            self.assertIn('unknown', cli.version())

    def test_main(self):
        out = io.StringIO()
        with mock.patch.object(sys, 'argv',
                               ['cinder-dmclone', 'status', '-f', 'json',
                                '--interval', '0'] + SCOPE), \
                mock.patch.object(status, 'iscsi_links',
                                  return_value={}) as links:
            code = cli.main(stdout=out, stderr=io.StringIO(),
                            execute=healthy_node())
        self.assertEqual(0, code)
        links.assert_called_once_with()
        self.assertEqual('ok', json.loads(out.getvalue())['health'])

    def test_console_logging_replaces_oslo_log_handler(self):
        # oslo.log's bare stderr handler would print cliff's DEBUG lines.
        root = logging.getLogger()
        bare = logging.StreamHandler(sys.stderr)
        other = logging.StreamHandler(io.StringIO())
        root.addHandler(bare)
        root.addHandler(other)
        self.run_cli(['status', '--interval', '0'] + SCOPE)
        self.assertNotIn(bare, root.handlers)
        self.assertIn(other, root.handlers)


class StatusTestCase(CLITestCase):

    def test_all_well_exits_0(self):
        code, out, err = self.run_cli(['status', '--interval', '0'] + SCOPE,
                                      healthy_node())
        self.assertEqual((0, ''), (code, err))
        fields = dict(self.table_rows(out)[1:])
        self.assertEqual('ok', fields['health'])
        self.assertEqual('2: 1 clone, 1 linear', fields['handles'])
        self.assertEqual('- (one sample)', fields['interval_seconds'])
        self.assertEqual('none', fields['leftovers'])

    def test_old_copy_being_wiped_alone_exits_0(self):
        lvs = healthy_node().lvs + '  cinder-volumes|%s\n' % RETIRING
        code, report = self.run_json(['--interval', '0'] + SCOPE,
                                     healthy_node(lvs=lvs))
        self.assertEqual(0, code)
        self.assertEqual('ok (1 old copy being wiped)', report['health'])
        (item,) = report['leftovers']
        self.assertEqual(('retiring_lv', 'cinder-volumes', RETIRING),
                         (item['kind'], item['volume_group'],
                          item['lv_name']))
        self.assertIn('Wiping LV %s failed' % RETIRING, item['hint'])

    def test_old_copies_outside_the_scope_are_not_listed(self):
        lvs = (healthy_node().lvs + '  other|%s\n  meta|%s\n'
               % (RETIRING, RETIRING))
        code, report = self.run_json(['--interval', '0'] + SCOPE,
                                     healthy_node(lvs=lvs))
        self.assertEqual([('retiring_lv', 'meta')],
                         [(i['kind'], i['volume_group'])
                          for i in report['leftovers']])
        code, report = self.run_json(['--interval', '0'],
                                     healthy_node(lvs=lvs))
        self.assertEqual(2, len(report['leftovers']))

    def test_attention_exits_1_and_says_why(self):
        bad = '%s: 0 8 clone 8 40/4096 128 5/1024 16 1 new 0 rw' % H3
        text = '\n'.join([
            '%s: 0 2097152 linear ' % H1,
            '%s: 0 131072 clone Error' % H2, bad]) + '\n'
        lvs = LVS + '  cinder-volumes|%s\n' % RETIRING
        code, out, err = self.run_cli(['status'] + SCOPE,
                                      FakeNode(statuses=[text], lvs=lvs))
        self.assertEqual((1, ''), (code, err))
        fields = dict(self.table_rows(out)[1:])
        self.assertEqual('attention: 1 leftover, 1 failed clone, '
                         '1 unreadable handle (1 old copy being wiped)',
                         fields['health'])
        self.assertEqual('%s: - from 10.0.0.1:3260, FAILED (Error)' % U2,
                         fields['transfers'])
        self.assertTrue(fields['unreadable'].startswith(H3 + ': '))
        self.assertIn(bad, fields['unreadable'])
        warnings = fields['warnings'].splitlines()
        self.assertEqual(2, len(warnings))
        self.assertIn('reports Error', warnings[1])

    def test_every_format(self):
        argv = ['status', '--interval', '0'] + SCOPE
        code, out, err = self.run_cli(argv + ['-f', 'json'])
        report = json.loads(out)
        self.assertEqual(1, code)
        self.assertEqual(['health', 'volume_groups', 'interval_seconds',
                          'handles', 'transfers', 'leftovers', 'unreadable',
                          'warnings'], list(report))
        self.assertEqual({'cinder-volumes': 'meta'}, report['volume_groups'])
        self.assertEqual([H1, H2, H3], [h['name'] for h in report['handles']])
        code, out, err = self.run_cli(argv + ['-f', 'yaml'])
        self.assertEqual(report, yaml.safe_load(out))
        code, out, err = self.run_cli(argv + ['-f', 'value', '-c', 'health',
                                              '-c', 'interval_seconds'])
        self.assertEqual('attention: 2 leftovers\nNone\n', out)
        code, out, err = self.run_cli(argv + ['-f', 'shell', '-c', 'health'])
        self.assertEqual('health="attention: 2 leftovers"\n', out)
        code, out, err = self.run_cli(argv + ['-f', 'json', '--noindent',
                                              '-c', 'transfers'])
        self.assertEqual(['transfers'], list(json.loads(out)))
        self.assertEqual(1, code)

    def test_every_volume_group(self):
        code, out, err = self.run_cli(['status', '--interval', '0'])
        fields = dict(self.table_rows(out)[1:])
        self.assertEqual('every volume group', fields['volume_groups'])
        code, out, err = self.run_cli(['status', '--interval', '0',
                                       '--volume-group', 'cinder-volumes'])
        fields = dict(self.table_rows(out)[1:])
        self.assertEqual('cinder-volumes', fields['volume_groups'])

    def test_unknown_column_exits_2(self):
        code, out, err = self.run_cli(['status', '-c', 'nosuch'] + SCOPE)
        self.assertEqual(2, code)
        self.assertIn('No recognized column names', err)

    def test_debug_shows_the_traceback(self):
        node = FakeNode(lvs=RuntimeError('lvs exploded'))
        code, out, err = self.run_cli(['--debug', 'status'] + SCOPE, node)
        self.assertEqual(2, code)
        self.assertIn('Traceback', err)
        self.assertTrue(err.endswith('cinder-dmclone: lvs exploded\n'), err)
        code, out, err = self.run_cli(['status'] + SCOPE, FakeNode(
            lvs=RuntimeError('lvs exploded')))
        self.assertEqual((2, 'cinder-dmclone: lvs exploded\n'), (code, err))


class ListTestCase(CLITestCase):

    def run_list(self, command, *argv, **kwargs):
        code, out, err = self.run_cli(command.split() + SCOPE + list(argv),
                                      **kwargs)
        self.assertEqual((0, ''), (code, err))
        return out

    def test_lists_exit_0_even_with_leftovers(self):
        for command in ('handle list', 'move list', 'leftover list'):
            self.run_list(command)

    def test_lists_exit_2_when_a_command_fails(self):
        for command in ('handle list', 'move list', 'leftover list'):
            node = FakeNode(lvs=processutils.ProcessExecutionError(
                stderr='no such VG', exit_code=5))
            code, out, err = self.run_cli(command.split() + SCOPE, node)
            self.assertEqual(2, code)
            self.assertIn('no such VG', err)

    def test_handle_list(self):
        rows = self.table_rows(self.run_list('handle list'))
        self.assertEqual([['Handle', 'Volume', 'Table', 'LV'],
                          [H1, U1, 'linear', 'ok'],
                          [H2, U2, 'clone', 'ok'],
                          [H3, U3, 'linear', 'MISSING']], rows)
        items = json.loads(self.run_list('handle list', '--long',
                                         '-f', 'json'))
        self.assertEqual({'Handle': H3, 'Volume': U3, 'Table': 'linear',
                          'LV': False, 'Volume Group': 'cinder-volumes',
                          'LV Name': 'volume-' + U3,
                          'UUID': 'DMCLONE-' + H3}, items[2])

    def test_handle_list_unknown_volume_and_uuid(self):
        odd = 'dmclone-cinder--volumes-odd'
        node = FakeNode(statuses=['%s: 0 8 linear \n' % odd], uuids='',
                        lvs='')
        code, out, err = self.run_cli(['handle', 'list', '--long', '-f',
                                       'csv'], node)
        self.assertEqual(0, code)
        self.assertEqual([['Handle', 'Volume', 'Table', 'LV', 'Volume Group',
                           'LV Name', 'UUID'],
                          [odd, 'None', 'linear', 'False', 'cinder-volumes',
                           'odd', 'None']],
                         list(csv.reader(io.StringIO(out))))
        node = FakeNode(statuses=['%s: 0 8 linear \n' % odd], uuids='',
                        lvs='')
        rows = self.table_rows(self.run_cli(['handle', 'list', '--long'],
                                            node)[1])
        self.assertEqual([odd, '-', 'linear', 'MISSING', 'cinder-volumes',
                          'odd', '-'], rows[1])

    def test_handle_list_sorted_on_request(self):
        out = self.run_list('handle list', '-f', 'value', '-c', 'Volume',
                            '--sort-column', 'Volume', '--sort-descending')
        self.assertEqual([U3, U2, U1], out.split())

    def test_move_list(self):
        node = FakeNode(statuses=[status_text(256), status_text(512)])
        rows = self.table_rows(self.run_list('move list', node=node))
        self.assertEqual([['Volume', 'State', 'Source', 'Progress', 'Rate',
                           'ETA'],
                          [U2, 'hydrating', '10.0.0.1:3260',
                           '512/1024 (50.0%)', '8.0 MiB/s', '4s']], rows)
        node = FakeNode(statuses=[status_text(256), status_text(512)])
        (item,) = json.loads(self.run_list('move list', '--long',
                                           '-f', 'json', node=node))
        self.assertEqual({
            'Volume': U2, 'State': 'hydrating', 'Source': '10.0.0.1:3260',
            'Progress': 50.0, 'Rate': 8 * 1024 ** 2, 'ETA': 4.0,
            'Handle': H2, 'Hydration': True, 'Hydrated Regions': 512,
            'Total Regions': 1024, 'Hydrating Regions': 16,
            'Region Bytes': 65536, 'Rate Source': 'sampled',
            'Stalled Seconds': None, 'Stale Source Attachment': None,
            'Source Node': None, 'Source Device': '8:16',
            'Source Portal': '10.0.0.1:3260',
            'Source IQN': 'iqn.2010-10.org.openstack:volume-' + U2,
            'Metadata LV': 'volume-%s-dmcmeta' % U2,
            'Metadata LV Exists': True, 'Failed': False,
            'Kernel State': None}, item)

    def test_move_list_long_for_humans(self):
        read = mock.Mock(return_value={'dmclone_state': 'cloned',
                                       'dmclone_source_node': 'node-a',
                                       'dmclone_stalled_seconds': '90'})
        text = status_text(256).replace(
            clone_status(256), clone_status(256, features='1 no_hydration'))
        out = self.run_list('move list', '--long', '--interval', '0',
                            node=FakeNode(statuses=[text]),
                            read_metadata=read)
        header, row = self.table_rows(out)
        row = dict(zip(header, row))
        self.assertEqual('cloned (no progress for 1m30s)', row['State'])
        self.assertEqual('node-a', row['Source'])
        self.assertEqual(('off', '-', '-', '1m30s'),
                         (row['Hydration'], row['Rate'], row['ETA'],
                          row['Stalled Seconds']))
        self.assertEqual('meta/volume-%s-dmcmeta' % U2, row['Metadata LV'])

    def test_move_list_failed_clone_everywhere(self):
        text = status_text(256).replace(clone_status(256), 'Fail')
        code, out, err = self.run_cli(['move', 'list', '--long', '-f',
                                       'yaml'], FakeNode(statuses=[text]))
        self.assertEqual(0, code)
        items = {item['Volume']: item for item in yaml.safe_load(out)}
        self.assertEqual(
            (None, None, None, True, 'Fail'),
            tuple(items[U2][k] for k in ('State', 'Progress', 'Hydration',
                                         'Failed', 'Kernel State')))
        self.assertEqual(100.0, items[U4]['Progress'])
        code, out, err = self.run_cli(['move', 'list', '--long'],
                                      FakeNode(statuses=[text]))
        header, *rows = self.table_rows(out)
        row = dict(zip(header, rows[0]))
        self.assertEqual(('-', 'FAILED (Fail)', '-', '?/volume-%s-dmcmeta'
                          % U2), (row['State'], row['Progress'],
                                  row['Hydration'], row['Metadata LV']))

    def test_leftover_list(self):
        lvs = LVS + '  cinder-volumes|%s\n' % RETIRING
        out = self.run_list('leftover list', '-f', 'csv',
                            node=FakeNode(lvs=lvs))
        rows = list(csv.reader(io.StringIO(out)))
        self.assertEqual(['Kind', 'Volume Group', 'Name', 'Hint'], rows[0])
        self.assertEqual(
            [['handle_without_lv', 'cinder-volumes', H3],
             ['metadata_lv_without_clone', 'meta',
              'volume-%s-dmcmeta' % U4],
             ['retiring_lv', 'cinder-volumes', RETIRING]],
            [row[:3] for row in rows[1:]])
        self.assertIn('dmsetup remove %s' % H3, rows[1][3])
        items = json.loads(self.run_list('leftover list', '--long', '-f',
                                         'json', node=FakeNode(lvs=lvs)))
        self.assertEqual('volume-' + U3, items[0]['LV Name'])
        out = self.run_list('leftover list', '-f', 'value', '-c', 'Name',
                            node=FakeNode(lvs=lvs))
        self.assertEqual([H3, 'volume-%s-dmcmeta' % U4, RETIRING],
                         out.split())


class DeprecatedAliasTestCase(CLITestCase):

    def test_runs_status_with_a_note(self):
        out = io.StringIO()
        with mock.patch('sys.stderr', new_callable=io.StringIO) as err:
            code = cli.status_alias(
                ['--json', '--interval', '0'] + SCOPE, stdout=out,
                execute=FakeNode(), links={})
        self.assertEqual(1, code)
        self.assertEqual(cli.DEPRECATION + '\n', err.getvalue())
        self.assertEqual(1, len(err.getvalue().splitlines()))
        report = json.loads(out.getvalue())
        self.assertEqual([H1, H2, H3], [h['name'] for h in report['handles']])

    def test_reads_sys_argv(self):
        with mock.patch.object(sys, 'argv', ['cinder-dmclone-status',
                                             '--interval', '-1']), \
                mock.patch('sys.stderr', new_callable=io.StringIO) as err:
            code = cli.status_alias(execute=FakeNode())
        self.assertEqual(2, code)
        self.assertIn('deprecated', err.getvalue())
        self.assertIn('--interval must not be negative', err.getvalue())
