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

"""The node report of cinder-dmclone on canned dmsetup and lvs output.

The report is read through ``cinder-dmclone status -f json``, which prints
all of it; tests/unit/test_cli.py covers the other commands and formats.
"""

import os
import tempfile
from unittest import mock

import ddt
from oslo_concurrency import processutils

from cinder import context
from cinder.tests.unit import test
from cinder.tests.unit import utils as tests_utils

from cinder_dmclone.cmd import status
from tests.unit.cli_fakes import CLITestCase
from tests.unit.cli_fakes import clone_status
from tests.unit.cli_fakes import FakeNode
from tests.unit.cli_fakes import H1
from tests.unit.cli_fakes import H2
from tests.unit.cli_fakes import H3
from tests.unit.cli_fakes import LVS
from tests.unit.cli_fakes import status_text
from tests.unit.cli_fakes import TABLES
from tests.unit.cli_fakes import U1
from tests.unit.cli_fakes import U2
from tests.unit.cli_fakes import U3
from tests.unit.cli_fakes import U4


@ddt.ddt
class StatusToolTestCase(CLITestCase):

    def test_an_unreadable_status_line_costs_only_its_device(self):
        bad = ('%s: 0 131072 clone 8 40/4096 128 5/1024 16 1 new_feature '
               '0 rw' % H2)
        text = status_text(256).replace(
            '%s: 0 131072 clone %s' % (H2, clone_status(256)), bad)
        text += ('odd:name: 0 8 linear \nno name at all\n'
                 'foreign: x 8 linear \n')
        node = FakeNode(statuses=[text], tables=TABLES + 'h: 0 x linear\n')
        code, report = self.run_json(
            ['--volume-group', 'cinder-volumes',
             '--metadata-volume-group', 'meta', '--interval', '0'], node)
        self.assertEqual(1, code)
        self.assertEqual([H1, H3], [h['name'] for h in report['handles']])
        self.assertEqual([H2], [u['name'] for u in report['unreadable']])
        self.assertIn(bad, report['unreadable'][0]['reason'])
        warnings = '\n'.join(report['warnings'])
        self.assertIn(bad, warnings)
        self.assertIn('no name at all', warnings)
        self.assertNotIn('odd:name', warnings)      # not the driver's
        self.assertNotIn('foreign', warnings)
        self.assertNotIn("'h'", warnings)

    def test_an_unreadable_table_line_is_a_warning(self):
        node = FakeNode(tables=TABLES + '%s: 0 x linear\nnonsense\n' % H1)
        code, report = self.run_json(
            ['--volume-group', 'cinder-volumes',
             '--metadata-volume-group', 'meta', '--interval', '0'], node)
        self.assertEqual([H1, H2, H3], [h['name'] for h in report['handles']])
        self.assertEqual([], report['unreadable'])
        warnings = '\n'.join(report['warnings'])
        self.assertIn('cannot read the table of %s' % H1, warnings)
        self.assertIn('cannot read the table of a device', warnings)

    def test_one_status_call_without_interval(self):
        node = FakeNode()
        code, report = self.run_json(
            ['--volume-group', 'cinder-volumes',
             '--metadata-volume-group', 'meta', '--interval', '0'], node)
        status_calls = [c for c in node.calls if c[:2] == ('dmsetup',
                                                           'status')]
        self.assertEqual([('dmsetup', 'status')], status_calls)
        self.assertEqual([H1, H2, H3],
                         [h['name'] for h in report['handles']])
        self.assertEqual(['linear', 'clone', 'linear'],
                         [h['table'] for h in report['handles']])
        self.assertEqual('DMCLONE-' + H1, report['handles'][0]['uuid'])
        self.assertEqual(U1, report['handles'][0]['volume_id'])
        (t,) = report['transfers']
        self.assertEqual(U2, t['volume_id'])
        self.assertEqual((256, 1024, 16), (t['hydrated_regions'],
                                           t['total_regions'],
                                           t['hydrating_regions']))
        self.assertEqual(25.0, t['percent'])
        self.assertEqual(65536, t['region_bytes'])
        self.assertIsNone(t['rate_bps'])
        self.assertIsNone(t['eta_seconds'])
        self.assertIsNone(t['rate_source'])
        self.assertEqual('8:16', t['source_device'])
        self.assertEqual('10.0.0.1:3260', t['source_portal'])
        self.assertEqual('volume-%s-dmcmeta' % U2, t['metadata_lv'])
        self.assertTrue(t['metadata_lv_exists'])
        self.assertTrue(t['hydration_enabled'])
        # H3's LV is gone; U4's metadata LV belongs to no clone here.
        kinds = {(item['kind'], item['lv_name'])
                 for item in report['leftovers']}
        self.assertEqual({('handle_without_lv', 'volume-' + U3),
                          ('metadata_lv_without_clone',
                           'volume-%s-dmcmeta' % U4)}, kinds)
        self.assertEqual(1, code)
        lvs_call = [c for c in node.calls if c[0] == 'lvs'][0]
        self.assertEqual(('cinder-volumes', 'meta'), lvs_call[-2:])

    def test_rate_and_eta_from_two_samples(self):
        node = FakeNode(statuses=[status_text(256), status_text(512)])
        code, report = self.run_json(
            ['--volume-group', 'cinder-volumes',
             '--metadata-volume-group', 'meta', '--interval', '4'], node)
        (t,) = report['transfers']
        self.assertEqual(512, t['hydrated_regions'])
        # 256 regions of 64 KiB in 4 s; 512 regions to go.
        self.assertEqual(256 * 65536 / 4.0, t['rate_bps'])
        self.assertEqual(8.0, t['eta_seconds'])
        self.assertEqual('sampled', t['rate_source'])
        self.assertEqual(4.0, report['interval_seconds'])

    def test_no_second_sample_when_nothing_hydrates(self):
        node = FakeNode(statuses=['%s: 0 8 linear \n' % H1])
        node.lvs = '  cinder-volumes|volume-%s\n' % U1
        code, report = self.run_json(['--volume-group', 'cinder-volumes'],
                                     node)
        self.assertEqual(1, len([c for c in node.calls
                                 if c[:2] == ('dmsetup', 'status')]))
        self.assertEqual(100.0, self.clock.now)
        self.assertEqual([], report['transfers'])
        self.assertEqual([], report['leftovers'])
        self.assertEqual(0, code)

    def test_every_vg_without_scope(self):
        node = FakeNode()
        code, report = self.run_json(['--interval', '0'], node)
        self.assertEqual(4, len(report['handles']))
        self.assertEqual(2, len(report['transfers']))
        # every VG: U4's metadata LV has its clone (OTHER) after all.
        self.assertEqual(['handle_without_lv', 'handle_without_lv'],
                         sorted(i['kind'] for i in report['leftovers']))
        self.assertIsNone(report['transfers'][0]['metadata_lv_exists'])
        self.assertEqual(('lvs', '--noheadings', '--separator', '|', '-o',
                          'vg_name,lv_name'),
                         [c for c in node.calls if c[0] == 'lvs'][0])

    def test_failed_clone_is_flagged(self):
        text = status_text(256).replace(clone_status(256), 'Fail')
        node = FakeNode(statuses=[text])
        code, report = self.run_json(
            ['--volume-group', 'cinder-volumes',
             '--metadata-volume-group', 'meta'], node)
        (t,) = report['transfers']
        self.assertTrue(t['failed'])
        self.assertEqual('Fail', t['kernel_state'])
        self.assertIn('reports Fail', report['warnings'][0])
        self.assertEqual(1, code)
        self.assertEqual(100.0, self.clock.now)
        row = self.move_row(['--volume-group', 'cinder-volumes',
                             '--metadata-volume-group', 'meta'],
                            FakeNode(statuses=[text]))
        self.assertEqual([U2, '-', '10.0.0.1:3260', 'FAILED (Fail)', '-',
                          '-'], row)

    def test_foreign_uuid_warned(self):
        node = FakeNode(uuids='%s|LVM-xyz\n' % H1)
        code, report = self.run_json(['--interval', '0'], node)
        self.assertIn('not one the driver makes', report['warnings'][0])
        self.assertEqual('LVM-xyz', report['handles'][0]['uuid'])

    def test_tables_for_humans(self):
        args = ['--volume-group', 'cinder-volumes',
                '--metadata-volume-group', 'meta', '--interval', '4']
        node = FakeNode(statuses=[status_text(256), status_text(512)])
        code, out, err = self.run_cli(['status'] + args, node)
        self.assertEqual((1, ''), (code, err))
        fields = dict(self.table_rows(out))
        self.assertEqual('attention: 2 leftovers', fields['health'])
        self.assertEqual('3: 2 linear, 1 clone; 1 without LV',
                         fields['handles'])
        self.assertEqual('%s: hydrating from 10.0.0.1:3260, 512/1024 '
                         '(50.0%%), 4.0 MiB/s, ETA 8s' % U2,
                         fields['transfers'])
        self.assertEqual('handle_without_lv cinder-volumes/%s\n'
                         'metadata_lv_without_clone meta/volume-%s-dmcmeta'
                         % (H3, U4), fields['leftovers'])
        self.assertEqual('4.0', fields['interval_seconds'])
        self.assertEqual('cinder-volumes (metadata in meta)',
                         fields['volume_groups'])
        self.assertEqual(('none', 'none'), (fields['unreadable'],
                                            fields['warnings']))
        row = self.move_row(args, FakeNode(statuses=[status_text(256),
                                                     status_text(512)]))
        self.assertEqual([U2, 'hydrating', '10.0.0.1:3260',
                          '512/1024 (50.0%)', '4.0 MiB/s', '8s'], row)

    def test_monitor_rate_from_database(self):
        node = FakeNode()
        metadata = {'dmclone_state': 'hydrating',
                    'dmclone_source_node': 'node-a',
                    'dmclone_rate_bps': '1048576',
                    'dmclone_eta_seconds': '3725'}
        read = mock.Mock(return_value=metadata)
        code, report = self.run_json(
            ['--volume-group', 'cinder-volumes',
             '--metadata-volume-group', 'meta', '--interval', '0'], node,
            read_metadata=read)
        read.assert_called_once_with(U2)
        (t,) = report['transfers']
        self.assertEqual(('hydrating', 'node-a', 1048576.0, 3725.0,
                          'monitor'),
                         (t['state'], t['source_node'], t['rate_bps'],
                          t['eta_seconds'], t['rate_source']))
        row = self.move_row(
            ['--volume-group', 'cinder-volumes',
             '--metadata-volume-group', 'meta', '--interval', '0'],
            FakeNode(), read_metadata=read)
        self.assertEqual([U2, 'hydrating', 'node-a', '256/1024 (25.0%)',
                          '1.0 MiB/s', '1h02m'], row)

    def test_stall_from_the_monitor(self):
        read = mock.Mock(return_value={'dmclone_state': 'hydrating',
                                       'dmclone_source_node': 'node-a',
                                       'dmclone_stalled_seconds': '330'})
        args = ['--volume-group', 'cinder-volumes',
                '--metadata-volume-group', 'meta', '--interval', '0']
        code, report = self.run_json(args, FakeNode(), read_metadata=read)
        self.assertEqual(330.0, report['transfers'][0]['stalled_seconds'])
        row = self.move_row(args, FakeNode(), read_metadata=read)
        self.assertEqual('hydrating (no progress for 5m30s)', row[1])

    @ddt.data(('stale_source_attachment',
               'cloned (waits: delete the stale attachment on node-a)'),
              ('awaiting_source',
               'cloned (waits: node-a to confirm its copy is closed)'))
    @ddt.unpack
    def test_move_waiting_in_cloned(self, key, shown):
        # Kept for a stale source attachment, or waiting for the source to
        # confirm that its copy is closed: the record says which.
        read = mock.Mock(return_value={
            'dmclone_state': 'cloned', 'dmclone_source_node': 'node-a',
            'dmclone_' + key: 'node-a'})
        args = ['--volume-group', 'cinder-volumes',
                '--metadata-volume-group', 'meta', '--interval', '0']
        code, report = self.run_json(args, FakeNode(), read_metadata=read)
        self.assertEqual('node-a', report['transfers'][0][key])
        row = self.move_row(args, FakeNode(), read_metadata=read)
        self.assertEqual(shown, row[1])

    U5 = '55555555-5555-5555-5555-555555555555'

    def node_conf(self, node_name):
        """A cinder.conf of one backend on cinder-volumes, on node_name."""
        fd, path = tempfile.mkstemp(suffix='.conf')
        with os.fdopen(fd, 'w') as f:
            f.write('[DEFAULT]\nenabled_backends = dmclone\nhost = %s\n'
                    '[dmclone]\nvolume_driver = %s\n'
                    'volume_group = cinder-volumes\n'
                    'dmclone_metadata_volume_group = meta\n'
                    % (node_name, status.DRIVER))
        self.addCleanup(os.unlink, path)
        return ['--config-file', path, '--interval', '0']

    def abandoned(self, node_name, records, host='node-b@dmclone#p'):
        """(exit status, abandoned_copy items, report) on node_name."""
        node = FakeNode(lvs=LVS + '  cinder-volumes|volume-%s\n' % self.U5)
        read = mock.Mock(side_effect=lambda vid: records.get(vid, {}))
        code, report = self.run_json(
            self.node_conf(node_name), node, read_metadata=read,
            read_host=mock.Mock(return_value=host), links={})
        return code, [i for i in report['leftovers']
                      if i['kind'] == 'abandoned_copy'], report

    def test_an_abandoned_old_copy_is_a_leftover(self):
        # Review 4: a node holding the old copy of a move abandoned as
        # lost (it was the lost source) shows it until it is removed,
        # whichever abandon of the volume came last.
        u5 = self.U5
        records = {u5: {'dmclone_old_copy_node-a': 'volume-' + u5,
                        'dmclone_lost_source': 'node-c',
                        'dmclone_lost_source_lv': 'volume-' + u5}}
        code, (item,), _ = self.abandoned('node-a', records)
        self.assertEqual(('cinder-volumes', 'volume-' + u5, u5,
                          ['node-a', 'node-c']),
                         (item['volume_group'], item['lv_name'],
                          item['volume_id'], item['nodes']))
        self.assertIn('remove it by hand', item['hint'])
        self.assertEqual(1, code)
        # on node-c too; on another node, not
        self.assertEqual(1, len(self.abandoned('node-c', records)[1]))
        self.assertEqual([], self.abandoned('node-d', records)[1])
        # removed: nothing to show
        read = mock.Mock(side_effect=records.get)
        code, report = self.run_json(
            self.node_conf('node-a'), FakeNode(), read_metadata=read,
            read_host=mock.Mock(return_value='node-b'), links={})
        self.assertNotIn('abandoned_copy',
                         [i['kind'] for i in report['leftovers']])

    def test_destination_lv_is_not_an_abandoned_copy(self):
        # Review 5: right after abandon-source the volume lives on node-b
        # in an LV named like node-a's old copy; after node-b's reboot
        # (no handle yet) its only copy is no old copy to remove.
        records = {self.U5: {
            'dmclone_old_copy_node-a': 'volume-' + self.U5,
            'dmclone_lost_source': 'node-a',
            'dmclone_lost_source_lv': 'volume-' + self.U5}}
        self.assertEqual([], self.abandoned('node-b', records)[1])
        # without the node's configuration: nothing advised, a warning
        node = FakeNode(lvs=LVS + '  cinder-volumes|volume-%s\n' % self.U5)
        read = mock.Mock(side_effect=lambda vid: records.get(vid, {}))
        args = ['--volume-group', 'cinder-volumes',
                '--metadata-volume-group', 'meta', '--interval', '0']
        code, report = self.run_json(args, node, read_metadata=read)
        self.assertEqual([], [i for i in report['leftovers']
                              if i['kind'] == status.ABANDONED_COPY])
        self.assertIn('cinder-volumes/volume-' + self.U5,
                      report['warnings'][-1])

    def test_a_stale_old_copy_key_names_no_live_volume(self):
        # The operator removed node-a's old copy; the key stays.  The
        # volume moved back to node-a: its LV there is the live volume,
        # and while it moves away again, the move's source.
        records = {self.U5: {
            'dmclone_old_copy_node-a': 'volume-' + self.U5}}
        self.assertEqual(
            [], self.abandoned('node-a', records, 'node-a@dmclone#p')[1])
        records[self.U5].update({'dmclone_state': 'hydrating',
                                 'dmclone_source_node': 'node-a',
                                 'dmclone_dest_node': 'node-b'})
        self.assertEqual([], self.abandoned('node-a', records)[1])

    # -- a volume whose LV is named after its _name_id ----------------------

    U6 = '66666666-6666-4666-8666-666666666666'

    def test_a_transfer_is_shown_under_its_volumes_id(self):
        # H2's LV is named after U2, the deleted temporary volume of a
        # generic migration; the volume is U6 (its _name_id is U2).
        # (Before: shown as volume U2, whose record holds no move.)
        records = {self.U6: {'dmclone_state': 'hydrating',
                             'dmclone_source_node': 'node-a'}}
        owners = {'volume-' + U1: U1, 'volume-' + U2: self.U6}
        read = mock.Mock(side_effect=lambda vid: records.get(vid, {}))
        code, report = self.run_json(
            ['--volume-group', 'cinder-volumes', '--interval', '0'],
            FakeNode(), read_metadata=read, read_owner=owners.get)
        (t,) = report['transfers']
        self.assertEqual((self.U6, 'hydrating', 'node-a'),
                         (t['volume_id'], t['state'], t['source_node']))
        by_lv = {h['lv_name']: h['volume_id'] for h in report['handles']}
        # H3's LV is no volume's: no id is made up for it.
        self.assertEqual({'volume-' + U1: U1, 'volume-' + U2: self.U6,
                          'volume-' + U3: None}, by_lv)

    def test_an_unreadable_owner_is_a_warning(self):
        read_owner = mock.Mock(side_effect=RuntimeError('db down'))
        code, report = self.run_json(
            ['--volume-group', 'cinder-volumes', '--interval', '0'],
            FakeNode(), read_metadata=mock.Mock(return_value={}),
            read_owner=read_owner)
        self.assertIsNone(report['transfers'][0]['volume_id'])
        self.assertIn('db down', '\n'.join(report['warnings']))

    def test_the_old_copy_of_a_name_id_volume_is_a_leftover(self):
        # node-a holds volume U6's old copy, named after U5, the deleted
        # temporary volume whose id U6's _name_id holds.  (Before: U5's
        # record was read, which names no copy: nothing shown.)
        u5 = self.U5
        records = {self.U6: {'dmclone_old_copy_node-a': 'volume-' + u5}}
        node = FakeNode(lvs=LVS + '  cinder-volumes|volume-%s\n' % u5)

        def read(vid):
            if vid == u5:   # (Cinder's API: a deleted volume has none)
                raise RuntimeError('Volume %s could not be found.' % vid)
            return records.get(vid, {})
        owners = {'volume-' + u5: self.U6}
        code, report = self.run_json(
            self.node_conf('node-a'), node, read_metadata=read,
            read_host=mock.Mock(return_value='node-b@dmclone#p'),
            read_owner=owners.get, links={})
        (item,) = [i for i in report['leftovers']
                   if i['kind'] == 'abandoned_copy']
        self.assertEqual(('volume-' + u5, self.U6, ['node-a']),
                         (item['lv_name'], item['volume_id'],
                          item['nodes']))
        self.assertEqual([], report['warnings'])

    def test_node_names_from_the_configuration(self):
        args = self.node_conf('node-a@dmclone')
        scope = status.load_config(args[1])
        self.assertEqual({'node-a'}, scope.node_names)

    def test_an_lv_without_handle_and_no_loss_is_no_leftover(self):
        u5 = '55555555-5555-5555-5555-555555555555'
        node = FakeNode(lvs=LVS + '  cinder-volumes|volume-%s\n' % u5)
        read = mock.Mock(return_value={})
        code, report = self.run_json(
            ['--volume-group', 'cinder-volumes',
             '--metadata-volume-group', 'meta', '--interval', '0'], node,
            read_metadata=read)
        self.assertNotIn('abandoned_copy',
                         [i['kind'] for i in report['leftovers']])
        self.assertEqual([], report['warnings'])

    def test_database_error_is_a_warning(self):
        read = mock.Mock(side_effect=RuntimeError('db down'))
        code, report = self.run_json(
            ['--volume-group', 'cinder-volumes', '--interval', '0'],
            FakeNode(), read_metadata=read)
        self.assertIn('db down', report['warnings'][0])
        self.assertIsNone(report['transfers'][0]['state'])

    def test_lvs_failure_exits_2(self):
        node = FakeNode(lvs=processutils.ProcessExecutionError(
            stderr='Volume group "nope" not found', exit_code=5))
        code, out, err = self.run_cli(['status', '--volume-group', 'nope',
                                       '--interval', '0'], node)
        self.assertEqual((2, ''), (code, out))
        self.assertIn('Volume group "nope" not found', err)
        self.assertTrue(err.startswith('cinder-dmclone: '), err)

    def test_bad_volume_group_name_exits_2_before_lvs(self):
        node = FakeNode()
        code, out, err = self.run_cli(['status', '--volume-group=-o',
                                       '--interval', '0'], node)
        self.assertEqual(2, code)
        self.assertIn('not a valid volume group name', err)
        self.assertEqual([], [c for c in node.calls if c[0] == 'lvs'])

    def test_must_be_root(self):
        with mock.patch.object(os, 'geteuid', return_value=1000):
            code, out, err = self.run_cli(['status', '-f', 'json'],
                                          execute=None)
        self.assertEqual((2, ''), (code, out))
        self.assertIn('run as root', err)

    def test_bad_arguments(self):
        for argv in (['--interval', '-1'],
                     ['--config-file', 'x', '--volume-group', 'v'],
                     ['--backend', 'b'],
                     ['--metadata-volume-group', 'm']):
            node = FakeNode()
            code, out, err = self.run_cli(['status'] + argv, node)
            self.assertEqual((2, ''), (code, out), argv)
            self.assertTrue(err.startswith('cinder-dmclone: '), err)
            self.assertEqual([], node.calls)


CONF_TEXT = """
[DEFAULT]
enabled_backends = dmclone,lvm
volume_name_template = vol-%%s
%s

[backend_defaults]
dmclone_metadata_volume_group = fast-meta

[dmclone]
volume_driver = cinder_dmclone.driver.DMCloneVolumeDriver
volume_group = local-vg

[lvm]
volume_driver = cinder.volume.drivers.lvm.LVMVolumeDriver
volume_group = lvm-vg

[other]
volume_driver = cinder_dmclone.driver.DMCloneVolumeDriver
"""


def local(text):
    """Canned output for the VG and name template of CONF_TEXT."""
    return text.replace('cinder--volumes-volume-', 'local--vg-vol-')


class ConfigTestCase(CLITestCase):

    def write_conf(self, extra=''):
        fd, path = tempfile.mkstemp(suffix='.conf')
        with os.fdopen(fd, 'w') as f:
            f.write(CONF_TEXT % extra)
        self.addCleanup(os.unlink, path)
        return path

    def test_enabled_dmclone_backends(self):
        scope = status.load_config(self.write_conf())
        self.assertEqual({'local-vg': 'fast-meta'}, scope.metadata_vgs)
        self.assertEqual('vol-%s', scope.name_template)
        self.assertFalse(scope.database)
        self.assertEqual(['fast-meta', 'local-vg'], scope.lvm_vgs())

    def test_named_backend_with_defaults(self):
        path = self.write_conf('[database]\nconnection = sqlite://')
        scope = status.load_config(path, ['other'])
        self.assertEqual({'cinder-volumes': 'fast-meta'},
                         scope.metadata_vgs)
        self.assertTrue(scope.database)

    def test_missing_section_or_file(self):
        path = self.write_conf()
        self.assertRaises(status.UsageError, status.load_config, path,
                          ['nosuch'])
        self.assertRaises(status.UsageError, status.load_config,
                          path + '.missing')

    def test_no_dmclone_backend(self):
        fd, path = tempfile.mkstemp(suffix='.conf')
        with os.fdopen(fd, 'w') as f:
            f.write('[DEFAULT]\nenabled_backends = lvm\n[lvm]\n'
                    'volume_driver = x\n')
        self.addCleanup(os.unlink, path)
        exc = self.assertRaises(status.UsageError, status.load_config, path)
        self.assertIn('--backend', str(exc))

    def test_main_reads_database_when_configured(self):
        path = self.write_conf('[database]\nconnection = sqlite://')
        read = mock.Mock(return_value={'dmclone_state': 'cloned'})
        node = FakeNode(statuses=[local(status_text(0))],
                        tables=local(TABLES))
        owners = {'vol-' + U2: U2}
        with mock.patch.object(status, 'database_reader',
                               return_value=read) as reader, \
                mock.patch.object(status, 'owner_reader',
                                  return_value=owners.get) as owner:
            code, report = self.run_json(
                ['--config-file', path, '--interval', '0'], node, links={})
        reader.assert_called_once_with(path)
        owner.assert_called_once_with(path, 'vol-%s')
        self.assertEqual('cloned', report['transfers'][0]['state'])
        self.assertEqual('8:16', report['transfers'][0]['source_device'])
        self.assertIsNone(report['transfers'][0]['source_portal'])

    def test_no_db_flag_and_unreadable_database(self):
        path = self.write_conf('[database]\nconnection = sqlite://')
        args = ['--config-file', path, '--interval', '0']
        with mock.patch.object(status, 'database_reader') as reader:
            self.run_json(args + ['--no-db'], links={})
            reader.assert_not_called()
            reader.side_effect = RuntimeError('no driver')
            code, report = self.run_json(args, links={})
        self.assertIn('no driver', report['warnings'][0])


class HelpersTestCase(test.TestCase):

    def test_volume_id(self):
        self.assertEqual(U1, status.volume_id('volume-' + U1, 'volume-%s'))
        self.assertIsNone(status.volume_id('snap-x', 'volume-%s'))

    def test_iscsi_links(self):
        tmp = tempfile.mkdtemp()
        self.addCleanup(os.rmdir, tmp)
        self.assertEqual({}, status.iscsi_links(tmp + '/missing'))
        names = ['ip-10.0.0.1:3260-iscsi-iqn.2010-10.org.x:v-lun-0',
                 'pci-0000:00:01.0-scsi-0:0:0:0']
        with mock.patch.object(os, 'listdir', return_value=names), \
                mock.patch.object(os, 'stat') as stat:
            stat.return_value.st_rdev = os.makedev(8, 16)
            links = status.iscsi_links(tmp)
        self.assertEqual({'8:16': ('10.0.0.1:3260', 'iqn.2010-10.org.x:v',
                                   0)}, links)
        with mock.patch.object(os, 'listdir', return_value=names[:1]), \
                mock.patch.object(os, 'stat', side_effect=OSError):
            self.assertEqual({}, status.iscsi_links(tmp))

    def test_sizes_and_durations(self):
        self.assertEqual('-', status.size_text(None))
        self.assertEqual('512.0 B', status.size_text(512))
        self.assertEqual('2.0 GiB', status.size_text(2 * 1024 ** 3))
        self.assertEqual('-', status.duration_text(None))
        self.assertEqual('59s', status.duration_text(59))
        self.assertEqual('1m05s', status.duration_text(65))
        self.assertEqual('2h00m', status.duration_text(7200))

    def test_owner_reader_on_cinders_database(self):
        # A volume's LV is named after its _name_id when it has one.
        ctxt = context.get_admin_context()
        migrated, temporary, plain = U2, U3, U1
        tests_utils.create_volume(ctxt, id=migrated, _name_id=temporary)
        tests_utils.create_volume(ctxt, id=plain)
        with mock.patch('oslo_config.cfg.CONF') as conf:
            owner = status.owner_reader('/etc/cinder/cinder.conf',
                                        'volume-%s')
        conf.assert_called_once_with(
            args=[], project='cinder',
            default_config_files=['/etc/cinder/cinder.conf'])
        self.assertEqual(migrated, owner('volume-' + temporary))
        self.assertIsNone(owner('volume-' + migrated))
        self.assertEqual(plain, owner('volume-' + plain))
        self.assertIsNone(owner('volume-' + U4))
        self.assertIsNone(owner('volume-%s-dmcmeta' % plain))
        self.assertIsNone(owner('legacy'))

    def test_database_reader(self):
        with mock.patch('oslo_config.cfg.CONF') as conf, \
                mock.patch('cinder.db.api.volume_admin_metadata_get',
                           return_value={'a': 'b'}) as get:
            read = status.database_reader('/etc/cinder/cinder.conf')
            self.assertEqual({'a': 'b'}, read(U1))
        conf.assert_called_once_with(
            args=[], project='cinder',
            default_config_files=['/etc/cinder/cinder.conf'])
        self.assertEqual(U1, get.call_args[0][1])
