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

"""The devstack plugin, dry run: what it writes and runs on each node.

devstack/tools/dry-run.sh sources the plugin with stand-ins for devstack's
functions (devstack/tools/fake-devstack.sh); the cinder.conf it renders
is read back here and checked against the driver's own options.
"""

import configparser
import os
import subprocess
import tempfile

from cinder.tests.unit import test

from cinder_dmclone import opts

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
DRY_RUN = os.path.join(ROOT, 'devstack', 'tools', 'dry-run.sh')
CONTROLLER = 'c-api,c-sch,c-vol,n-api,n-cpu,tempest'
COMPUTE = 'n-cpu,c-vol'


class DevstackDryRunTestCase(test.TestCase):

    def dry_run(self, *phases, expect_rc=0, **env):
        workdir = tempfile.mkdtemp()
        self.addCleanup(subprocess.call, ['rm', '-rf', workdir])
        full_env = {k: v for k, v in os.environ.items()
                    if not k.startswith(('CINDER_DMCLONE_', 'DRYRUN_'))}
        full_env.update(env)
        proc = subprocess.run(['bash', DRY_RUN, workdir] + list(phases),
                              capture_output=True, text=True, env=full_env)
        self.assertEqual(expect_rc, proc.returncode, proc.stderr)
        self.workdir = workdir
        self.stderr = proc.stderr
        return proc

    def read(self, name):
        with open(os.path.join(self.workdir, name)) as f:
            return f.read()

    def ini(self, name='cinder.conf'):
        # DEFAULT as a plain section: its keys must not leak into others.
        parser = configparser.RawConfigParser(
            interpolation=None, default_section='no default section')
        parser.read(os.path.join(self.workdir, name))
        return parser

    def commands(self):
        return self.read('commands.log').splitlines()

    def test_single_node(self):
        self.dry_run(ENABLED_SERVICES=CONTROLLER, HOST_IP='192.0.2.10')
        conf = self.ini()
        self.assertEqual('dmclone', conf.get('DEFAULT', 'enabled_backends'))
        self.assertEqual('dmclone',
                         conf.get('DEFAULT', 'default_volume_type'))
        section = dict(conf.items('dmclone'))
        self.assertEqual({
            'volume_driver': 'cinder_dmclone.driver.DMCloneVolumeDriver',
            'volume_backend_name': 'dmclone',
            'volume_group': 'stack-volumes-dmclone',
            'lvm_type': 'default',
            'target_helper': 'lioadm',
            'target_protocol': 'iscsi',
            'target_ip_address': '192.0.2.10',
            'dmclone_region_size': '64',
            'dmclone_hydration_threshold': '64',
            'dmclone_hydration_batch_size': '16',
            'dmclone_monitor_interval': '10',
            'dmclone_transfer_timeout': '45'}, section)
        # the plugin's defaults are the driver's
        for opt in opts.dmclone_opts:
            if opt.name in section:
                self.assertEqual(str(opt.default), section[opt.name],
                                 opt.name)
        cmds = self.commands()
        for mod in ('dm_clone', 'target_core_mod', 'iscsi_target_mod'):
            self.assertIn('sudo modprobe %s' % mod, cmds)
        self.assertEqual(['dm_clone', 'target_core_mod', 'iscsi_target_mod'],
                         self.read('modules-load.conf').split())
        self.assertIn('sudo dmsetup targets', cmds)
        self.assertIn('setup_develop %s' % ROOT, cmds)
        self.assertIn('init_lvm_volume_group stack-volumes-dmclone 24G',
                      cmds)
        with open(os.path.join(ROOT, 'etc', 'cinder', 'rootwrap.d',
                               'dmclone.filters')) as f:
            self.assertEqual(
                f.read(), self.read('etc-cinder/rootwrap.d/dmclone.filters'))
        self.assertIn('openstack --os-cloud devstack-admin --os-region-name '
                      'RegionOne volume type create --property '
                      'volume_backend_name=dmclone dmclone', cmds)
        tempest = self.ini('tempest.conf')
        self.assertEqual('dmclone', tempest.get('volume', 'volume_type'))
        self.assertEqual('True', tempest.get('compute-feature-enabled',
                                             'live_migration'))
        # the modules are checked before anything is installed
        self.assertLess(cmds.index('sudo dmsetup targets'),
                        cmds.index('setup_develop %s' % ROOT))

    def test_multinode_nodes_share_the_backend(self):
        sections = {}
        for node, services, ip in (('controller', CONTROLLER, '192.0.2.10'),
                                   ('compute', COMPUTE, '192.0.2.11')):
            self.dry_run(
                ENABLED_SERVICES=services, HOST_IP=ip,
                CINDER_DMCLONE_METADATA_VOLUME_GROUP='stack-dmclone-meta',
                CINDER_DMCLONE_HYDRATION_BATCH_SIZE='32')
            sections[node] = dict(self.ini().items('dmclone'))
            cmds = self.commands()
            self.assertIn('init_lvm_volume_group stack-dmclone-meta 2G',
                          cmds)
            created = [c for c in cmds if 'volume type create' in c]
            self.assertEqual(1 if node == 'controller' else 0, len(created))
            if node == 'compute':
                self.assertFalse(os.path.exists(os.path.join(
                    self.workdir, 'tempest.conf')))
        controller, compute = sections['controller'], sections['compute']
        self.assertEqual('192.0.2.10', controller.pop('target_ip_address'))
        self.assertEqual('192.0.2.11', compute.pop('target_ip_address'))
        self.assertEqual(controller, compute)
        self.assertEqual('stack-dmclone-meta',
                         compute['dmclone_metadata_volume_group'])
        self.assertEqual('32', compute['dmclone_hydration_batch_size'])

    def test_volume_services_share_etcd_for_locks(self):
        # A compute node enables no etcd3, so devstack leaves Cinder's
        # node-local default, which the driver refuses.
        self.dry_run(ENABLED_SERVICES=COMPUTE, HOST_IP='192.0.2.11',
                     SERVICE_HOST='192.0.2.10')
        self.assertEqual('etcd3+http://192.0.2.10:2379?api_version=v3',
                         self.ini().get('coordination', 'backend_url'))

    def _coordination_after(self, preset, **env):
        workdir = tempfile.mkdtemp()
        self.addCleanup(subprocess.call, ['rm', '-rf', workdir])
        with open(os.path.join(workdir, 'cinder.conf'), 'w') as f:
            f.write('[coordination]\nbackend_url = %s\n' % preset)
        subprocess.run(['bash', DRY_RUN, workdir, 'stack:post-config'],
                       capture_output=True, check=True,
                       env=dict(os.environ, ENABLED_SERVICES=COMPUTE,
                                CINDER_DMCLONE_CREATE_VG='False', **env))
        self.workdir = workdir
        return self.ini().get('coordination', 'backend_url')

    def test_shared_coordination_backend_is_kept(self):
        self.assertEqual('redis://192.0.2.5:6379',
                         self._coordination_after('redis://192.0.2.5:6379'))

    def test_node_local_coordination_backend_is_replaced(self):
        self.assertEqual(
            'zookeeper://192.0.2.5:2181',
            self._coordination_after(
                'file:///opt/stack/data/cinder',
                CINDER_DMCLONE_COORDINATION_URL='zookeeper://192.0.2.5:2181'))

    def test_node_without_volume_service_is_left_alone(self):
        self.dry_run(ENABLED_SERVICES='n-cpu,q-agt')
        self.assertEqual('', self.read('cinder.conf'))
        self.assertEqual([], [c for c in self.commands()
                              if not c.startswith('===')])

    def test_shared_with_other_backends(self):
        workdir = tempfile.mkdtemp()
        self.addCleanup(subprocess.call, ['rm', '-rf', workdir])
        with open(os.path.join(workdir, 'cinder.conf'), 'w') as f:
            f.write('[DEFAULT]\nenabled_backends = lvmdriver-1\n'
                    'default_volume_type = lvmdriver-1\n')
        proc = subprocess.run(
            ['bash', DRY_RUN, workdir, 'stack:post-config'],
            capture_output=True, text=True,
            env=dict(os.environ, ENABLED_SERVICES=COMPUTE,
                     CINDER_DMCLONE_EXCLUSIVE='False',
                     CINDER_DMCLONE_CREATE_VG='False',
                     CINDER_DMCLONE_NODE_NAME='compute-1'))
        self.assertEqual(0, proc.returncode, proc.stderr)
        self.workdir = workdir
        conf = self.ini()
        self.assertEqual('lvmdriver-1,dmclone',
                         conf.get('DEFAULT', 'enabled_backends'))
        self.assertEqual('lvmdriver-1',
                         conf.get('DEFAULT', 'default_volume_type'))
        self.assertEqual('compute-1', conf.get('dmclone',
                                               'dmclone_node_name'))
        self.assertFalse(any(c.startswith('init_lvm_volume_group')
                             for c in self.commands()))
        # running the phase again changes nothing
        subprocess.run(['bash', DRY_RUN, workdir, 'stack:post-config'],
                       capture_output=True, env=dict(
                           os.environ, ENABLED_SERVICES=COMPUTE,
                           CINDER_DMCLONE_EXCLUSIVE='False'), check=True)
        self.assertEqual('lvmdriver-1,dmclone',
                         self.ini().get('DEFAULT', 'enabled_backends'))

    def test_missing_kernel_module_stops_the_stack(self):
        self.dry_run(expect_rc=1, DRYRUN_MISSING_MODULES='iscsi_target_mod')
        self.assertIn('no module iscsi_target_mod', self.stderr)
        self.assertNotIn('stack install', self.read('commands.log'))

    def test_missing_clone_target_stops_the_stack(self):
        self.dry_run(expect_rc=1, DRYRUN_NO_CLONE_TARGET='1')
        self.assertIn('no clone target', self.stderr)

    def test_bad_settings_are_refused_early(self):
        for env, message in (
                ({'CINDER_DMCLONE_REGION_SIZE': '48'}, 'power of two'),
                ({'CINDER_DMCLONE_REGION_SIZE': '2097152'}, 'power of two'),
                ({'CINDER_DMCLONE_HYDRATION_THRESHOLD': '0'},
                 'not a positive integer'),
                ({'CINDER_DMCLONE_TRANSFER_TIMEOUT': '5'}, 'at least 10'),
                ({'CINDER_DMCLONE_TARGET_IP': '', 'HOST_IP': ''},
                 'no iSCSI address')):
            self.dry_run(expect_rc=1, **env)
            self.assertIn(message, self.stderr)
            self.assertNotIn('modprobe', self.read('commands.log'))

    def test_unstack_and_clean(self):
        ours = 'dmclone-stack--volumes--dmclone-volume-1'
        devices = '\n'.join([
            '%s DMCLONE-%s' % (ours, ours),
            'dmclone-other-volume-2 DMCLONE-dmclone-other-volume-2',
            'stack--volumes--dmclone-volume--1 LVM-abc'])
        self.dry_run('stack:pre-install', 'stack:post-config', 'unstack',
                     'clean', ENABLED_SERVICES=COMPUTE,
                     DRYRUN_DM_DEVICES=devices,
                     CINDER_DMCLONE_METADATA_VOLUME_GROUP='meta-vg')
        cmds = self.commands()
        removed = [c for c in cmds if c.startswith('sudo dmsetup remove')]
        self.assertEqual(['sudo dmsetup remove --retry %s' % ours] * 2,
                         removed)
        self.assertIn('clean_lvm_volume_group stack-volumes-dmclone', cmds)
        self.assertIn('clean_lvm_volume_group meta-vg', cmds)
        self.assertFalse(os.path.exists(os.path.join(
            self.workdir, 'etc-cinder/rootwrap.d/dmclone.filters')))
        self.assertFalse(os.path.exists(os.path.join(
            self.workdir, 'modules-load.conf')))

    def test_usage(self):
        proc = subprocess.run(['bash', DRY_RUN], capture_output=True,
                              text=True)
        self.assertEqual(2, proc.returncode)
        self.assertIn('usage', proc.stderr)
