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

"""``cinder-dmclone move abandon-source``: the command line around it.

What the command does to the node is test_lost_source.py's concern; here
its output, exit statuses and configuration, over the same two-node model
(``main(argv, lost_source=...)`` replaces the node and Cinder).
"""

import argparse
import json
import os

import fixtures

from cinder_dmclone.cmd import abandon
from cinder_dmclone.cmd import cli
from cinder_dmclone.cmd import status
from cinder_dmclone import exception as dmc_exception
from cinder_dmclone import region_map
from tests.harness import fake_cluster as cl
from tests.unit.cli_fakes import CLITestCase
from tests.unit import test_lost_source

REGION_BYTES = test_lost_source.REGION_BYTES


class AbandonCommandTestCase(CLITestCase):

    def setUp(self):
        super().setUp()
        self.h = test_lost_source.Harness(self, hydrated=range(16))
        self.h.lose_a()
        self.closed = []
        self.args = []

    def factory(self, args):
        self.args.append(args)
        return self.h.command(), lambda: self.closed.append(True)

    def abandon(self, *argv):
        return self.run_cli(['move', 'abandon-source', cl.VOLUME_ID]
                            + list(argv), lost_source=self.factory)

    def test_json(self):
        code, out, err = self.abandon('-f', 'json')
        self.assertEqual(0, code, err)
        shown = json.loads(out)
        # what it does is logged (stderr) as it goes, the list's path too
        self.assertIn('zeroing them. Their list: %s' % shown['ranges_file'],
                      err)
        uncopied = test_lost_source.REGIONS - 16
        self.assertEqual({
            'volume_id': cl.VOLUME_ID, 'status': 'error',
            'source_node': 'node-a', 'uncopied_regions': uncopied,
            'total_regions': test_lost_source.REGIONS,
            'region_bytes': REGION_BYTES,
            'uncopied_bytes': uncopied * REGION_BYTES,
            'uncopied_ranges': [{'offset': 16 * REGION_BYTES,
                                 'length': uncopied * REGION_BYTES}],
            'ranges_file': os.path.join(self.h.state_dir,
                                        'lost-%s.json' % cl.VOLUME_ID),
            'left_on_source': {'node': 'node-a', 'host': self.h.a.host,
                               'lv': cl.LV,
                               'target_iqn': cl.FakeTargetIQN,
                               'target_portal': '10.0.0.1:3260'}}, shown)
        self.assertEqual([True], self.closed)
        self.h.assert_abandoned()

    def test_table(self):
        code, out, err = self.abandon()
        self.assertEqual(0, code, err)
        self.assertNotIn('cinder-dmclone:', err)
        rows = dict(self.table_rows(out)[1:])
        self.assertEqual('1M+1023M', rows['uncopied_ranges'])
        self.assertEqual('16368 of 16384 (1023.0 MiB)',
                         rows['uncopied_regions'])
        self.assertIn('LV %s (not wiped)' % cl.LV, rows['left_on_source'])
        self.assertIn(cl.FakeTargetIQN, rows['left_on_source'])

    def test_a_long_list_is_cut_in_tables_only(self):
        self.h.set_hydrated(range(0, 100, 2))
        code, out, err = self.abandon()
        self.assertEqual(0, code, err)
        lines = dict(self.table_rows(out)[1:])['uncopied_ranges'].split('\n')
        self.assertEqual(cli.RANGE_LINES + 1, len(lines))
        self.assertEqual('... 30 more (see ranges_file)', lines[-1])

    def test_refusal_exits_2_and_says_why(self):
        self.h.a.service_up = True
        code, out, err = self.abandon()
        self.assertEqual((2, ''), (code, out))
        self.assertIn('cinder-dmclone: Not abandoning the source of volume '
                      '%s: the volume service of its source node-a'
                      % cl.VOLUME_ID, err)
        self.assertEqual(1, len(err.splitlines()))
        self.assertEqual([True], self.closed)
        self.assertEqual('hydrating', self.h.c.transfer().state)

    def test_force(self):
        self.h.a.service_up = True
        code, out, err = self.abandon('--force', '-f', 'value', '-c',
                                      'status')
        self.assertEqual((0, 'error\n'), (code, out))
        self.assertIn('without checking that it is lost (--force)', err)
        self.assertTrue(self.args[0].force)

    def test_options_reach_the_factory(self):
        self.abandon('--config-file', '/a.conf', '--config-file', '/b.conf',
                     '--backend', 'lvm1')
        self.assertEqual((['/a.conf', '/b.conf'], 'lvm1', False),
                         (self.args[0].config_file, self.args[0].backend,
                          self.args[0].force))

    def test_run_as_root(self):
        self.mock_object(cli.os, 'geteuid', return_value=1000)
        code, out, err = self.run_cli(['move', 'abandon-source',
                                       cl.VOLUME_ID])
        self.assertEqual(2, code)
        self.assertIn('run as root', err)

    def test_help_says_force_is_dangerous(self):
        code, out, err = self.run_cli(['help', 'move', 'abandon-source'])
        self.assertEqual(0, code)
        self.assertIn('DANGEROUS', out)
        self.assertIn('VOLUME_ID', out)


class NodeConfigTestCase(CLITestCase):

    def write(self, name, text):
        path = os.path.join(self.dir, name)
        with open(path, 'w') as f:
            f.write(text)
        return path

    def setUp(self):
        super().setUp()
        self.dir = self.useFixture(fixtures.TempDir()).path
        self.common = self.write('cinder.conf', (
            '[DEFAULT]\nhost = controller\nstate_path = /srv/cinder\n'
            'enabled_backends = dmclone\n'
            '[backend_defaults]\nlvm_type = thin\n'
            '[dmclone]\nvolume_driver = cinder_dmclone.driver.'
            'DMCloneVolumeDriver\n'))
        self.node = self.write('node-b.conf', (
            '[DEFAULT]\nhost = node-b\n[dmclone]\nvolume_group = dmc-b\n'
            'dmclone_metadata_volume_group = dmc-b-meta\n'))

    def test_the_files_in_order(self):
        node = abandon.node_config([self.common, self.node])
        self.assertEqual({
            'section': 'dmclone', 'volume_group': 'dmc-b',
            'metadata_volume_group': 'dmc-b-meta', 'lvm_type': 'thin',
            'lvm_conf': '/etc/cinder/lvm.conf', 'node_names': {'node-b'},
            'shared_file_locks': False, 'node_name': 'node-b',
            'thin_map_max_mappings': None,
            'state_dir': '/srv/cinder/dmclone'}, node)

    def test_the_thin_maps_are_the_nodes_own(self):
        # The zeroing of a thin LV reads what it maps as the node's
        # service would: its node name (the pool's lock and records),
        # volume group, state directory and bound on the dump.
        from cinder import coordination
        from cinder_dmclone import clone
        from cinder_dmclone import lost_source
        self.override_config('backend_url', 'etcd3+http://192.0.2.10:2379',
                             group='coordination')
        self.mock_object(abandon, '_lvm')
        self.mock_object(abandon, '_iscsi_connector')
        self.mock_object(clone, 'Clones')
        self.mock_object(coordination.COORDINATOR, 'start')
        made = self.mock_object(lost_source, 'LostSource')
        extra = self.write('m.conf', (
            '[dmclone]\ndmclone_thin_map_max_mappings = 4321\n'))
        abandon.from_config(argparse.Namespace(
            config_file=[self.common, self.node, extra], backend=None))
        maps = made.call_args.kwargs['thin_maps']
        self.assertEqual(('node-b', 'dmc-b', '/srv/cinder/dmclone', 4321),
                         (maps.node_name, maps.vg_name, maps.record_dir,
                          maps.max_mappings))
        # (It waits for another reader's dump as long as the operator
        # lets it: without the map it would zero every range never
        # copied, mapping a thin LV whole.  Review of 9e1ea8b.)
        self.assertIsNone(maps.lock_wait)
        abandon.from_config(argparse.Namespace(
            config_file=[self.common, self.node], backend=None))
        self.assertEqual(
            region_map.ThinMaps.MAX_MAPPINGS,
            made.call_args.kwargs['thin_maps'].max_mappings)

    def test_node_local_coordination_refused_as_by_the_driver(self):
        # The command takes the volume's lock: with per-node locks it
        # would not exclude the other node's service.  Refused before
        # anything touches the node (here: LVM).
        class Reached(Exception):
            pass
        self.mock_object(abandon, '_lvm', side_effect=Reached)
        for url, shared, ok in (
                ('file:///shared/locks', 'false', False),
                ('file:///shared/locks', 'true', True),
                ('ipc://', 'true', False),
                ('etcd3+http://192.0.2.10:2379', 'false', True)):
            # (An override, as the test base sets one: it wins over files.)
            self.override_config('backend_url', url, group='coordination')
            extra = self.write('c.conf', (
                '[dmclone]\ndmclone_shared_file_locks = %s\n' % shared))
            args = argparse.Namespace(
                config_file=[self.common, self.node, extra], backend=None)
            if ok:
                self.assertRaises(Reached, abandon.from_config, args)
            else:
                exc = self.assertRaises(
                    dmc_exception.NodeLocalCoordination,
                    abandon.from_config, args)
                self.assertIn('[coordination] backend_url', str(exc))

    def test_node_name_as_the_driver_takes_it(self):
        self.assertEqual({'controller'},
                         abandon.node_config([self.common])['node_names'])
        extra = self.write('x.conf', '[dmclone]\nbackend_host = b2\n'
                                     'dmclone_node_aliases = b.example\n')
        self.assertEqual({'b2', 'b.example'}, abandon.node_config(
            [self.common, self.node, extra])['node_names'])
        extra = self.write('y.conf', '[dmclone]\ndmclone_node_name = nb\n')
        self.assertEqual({'nb'}, abandon.node_config(
            [self.common, self.node, extra])['node_names'])

    def test_usage_errors(self):
        self.assertRaisesRegex(status.UsageError, 'no such file',
                               abandon.node_config, ['/nonexistent.conf'])
        other = self.write('o.conf', '[DEFAULT]\nenabled_backends = lvm\n'
                                     '[lvm]\nvolume_driver = x\n')
        self.assertRaisesRegex(status.UsageError, 'with --backend',
                               abandon.node_config, [other])
        self.assertEqual('lvm', abandon.node_config(
            [other], backend='lvm')['section'])
        self.assertRaisesRegex(status.UsageError, 'found nothere',
                               abandon.node_config, [other],
                               backend='nothere')
