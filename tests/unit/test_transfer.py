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

"""Persisted transfer state, the Store and the destination's steps."""

from unittest import mock

import ddt

from cinder import context
from cinder import exception
from cinder.tests.unit import fake_constants as fake
from cinder.tests.unit import test
from os_brick.initiator.connectors import iscsi

from cinder_dmclone import dmsetup
from cinder_dmclone import exception as dmc_exception
from cinder_dmclone import layout
from cinder_dmclone import periodic
from cinder_dmclone import privileged
from cinder_dmclone import transfer
from tests.unit import fakes

VOLUME_ID = fake.VOLUME_ID
LV = 'volume-%s' % VOLUME_ID
VG = 'dmc-vg'
META_VG = 'fast-vg'
LV_PATH = '/dev/%s/%s' % (VG, LV)
META = LV + '-dmcmeta'
META_PATH = '/dev/%s/%s' % (META_VG, META)
HANDLE = layout.handle_name(VG, LV)
HANDLE_PATH = layout.handle_path(VG, LV)
SECTORS = 2097152          # 1 GiB
REGION = 128               # 64 KiB
IQN = 'iqn.2010-10.org.openstack:%s' % LV
PORTAL = '10.0.0.1:3260'
SOURCE = '/dev/disk/by-path/ip-%s-iscsi-%s-lun-0' % (PORTAL, IQN)


def make_transfer(**overrides):
    values = dict(volume_id=VOLUME_ID, lv_name=LV, state=transfer.PREPARING,
                  source_host='node-a@dmclone#dmclone',
                  dest_host='node-b@dmclone#dmclone', source_node='node-a',
                  dest_node='node-b', region_sectors=REGION,
                  clone_sectors=SECTORS, target_portal=PORTAL,
                  target_iqn=IQN, target_lun=0)
    values.update(overrides)
    return transfer.Transfer(**values)


def metadata(**overrides):
    md = make_transfer().to_metadata()
    for key, value in overrides.items():
        if value is None:
            md.pop('dmclone_' + key)
        else:
            md['dmclone_' + key] = value
    return md


@ddt.ddt
class TransferMetadataTestCase(test.TestCase):

    def test_round_trip(self):
        t = make_transfer(state=transfer.HYDRATING, target_lun=3)
        md = t.to_metadata()
        self.assertEqual(set('dmclone_' + f for f in transfer.Transfer.FIELDS
                             + transfer.Transfer.OPTIONAL_FIELDS),
                         set(md))
        self.assertTrue(all(isinstance(v, str) for v in md.values()))
        self.assertEqual('3', md['dmclone_target_lun'])
        self.assertEqual(t, transfer.Transfer.from_metadata(VOLUME_ID, md))

    @ddt.data(None, {}, {'readonly': 'True'},
              {'dmclone_percent': '42.0', 'dmclone_lv_name': LV})
    def test_no_state_no_transfer(self, md):
        self.assertIsNone(transfer.Transfer.from_metadata(VOLUME_ID, md))

    def test_other_admin_metadata_is_ignored(self):
        md = dict(metadata(), readonly='True', attached_mode='rw')
        self.assertEqual(make_transfer(),
                         transfer.Transfer.from_metadata(VOLUME_ID, md))

    @ddt.data(*[f for f in transfer.Transfer.FIELDS if f != 'state'])
    def test_missing_field(self, field):
        exc = self.assertRaises(transfer.TransferStateInvalid,
                                transfer.Transfer.from_metadata, VOLUME_ID,
                                metadata(**{field: None}))
        self.assertIn('dmclone_%s is missing' % field, str(exc))
        self.assertIn(VOLUME_ID, str(exc))
        self.assertIn('nothing was changed', str(exc))

    @ddt.data(
        ('state', 'moving', "unknown state 'moving'"),
        ('state', 'PREPARING', "unknown state 'PREPARING'"),
        ('region_sectors', 'abc', "region_sectors='abc' is not an integer"),
        ('region_sectors', '', "region_sectors='' is not an integer"),
        ('region_sectors', '0', 'region_sectors=0 is below 1'),
        ('region_sectors', '-128', 'region_sectors=-128 is below 1'),
        ('region_sectors', '100', 'not a power of two'),
        ('region_sectors', '4', 'not a power of two'),
        ('region_sectors', '4194304', 'not a power of two'),
        ('clone_sectors', '0', 'clone_sectors=0 is below 1'),
        ('clone_sectors', '-8', 'clone_sectors=-8 is below 1'),
        ('clone_sectors', '1.5', "clone_sectors='1.5' is not an integer"),
        ('target_lun', '-1', 'target_lun=-1 is below 0'),
        ('target_lun', 'zero', "target_lun='zero' is not an integer"),
        ('target_iqn', 'iqn.bad', "target_iqn='iqn.bad' is malformed"),
        ('target_iqn', 'eui.02004567A425678D', 'target_iqn='),
        ('target_iqn', IQN + ' x', 'target_iqn='),
        ('target_iqn', IQN + '\n', 'target_iqn='),
        ('target_portal', '10.0.0.1', "target_portal='10.0.0.1' is "
                                      "malformed"),
        ('target_portal', PORTAL + ';reboot', 'target_portal='),
        ('target_portal', PORTAL + '\n', 'target_portal='),
        ('target_portal', ':3260', 'target_portal='),
        ('source_host', 'node a@dmclone', 'source_host='),
        ('source_host', '', 'source_host='),
        ('dest_host', 'node-b@dmclone#x\n', 'dest_host='),
        ('source_node', 'a/b', 'source_node='),
        ('dest_node', '$(reboot)', 'dest_node='),
        ('lv_name', '../etc', 'not a valid logical volume name'),
        ('lv_name', 'snapshot-1', 'not a valid logical volume name'),
        ('lv_name', 'a b', 'not a valid logical volume name'),
        ('lv_name', '', 'not a valid logical volume name'),
    )
    @ddt.unpack
    def test_malformed(self, field, value, message):
        exc = self.assertRaises(transfer.TransferStateInvalid,
                                transfer.Transfer.from_metadata, VOLUME_ID,
                                metadata(**{field: value}))
        self.assertIn(message, str(exc))
        self.assertIn(VOLUME_ID, str(exc))

    @ddt.data('region_sectors', 'clone_sectors', 'target_lun')
    def test_non_string_integer(self, field):
        md = metadata()
        md['dmclone_' + field] = [1]
        self.assertRaises(transfer.TransferStateInvalid,
                          transfer.Transfer.from_metadata, VOLUME_ID, md)

    @ddt.data('target_iqn', 'target_portal', 'source_host', 'dest_node')
    def test_non_string_text(self, field):
        md = metadata()
        md['dmclone_' + field] = 5
        exc = self.assertRaises(transfer.TransferStateInvalid,
                                transfer.Transfer.from_metadata, VOLUME_ID,
                                md)
        self.assertIn('%s=5 is malformed' % field, str(exc))

    def test_same_source_and_dest(self):
        exc = self.assertRaises(
            transfer.TransferStateInvalid, transfer.Transfer.from_metadata,
            VOLUME_ID, metadata(dest_host='node-a@dmclone#dmclone'))
        self.assertIn('source and destination are the same host', str(exc))

    @ddt.data(*transfer.STATES)
    def test_every_state(self, state):
        t = transfer.Transfer.from_metadata(VOLUME_ID, metadata(state=state))
        self.assertEqual(state, t.state)

    @ddt.data('8', '2097152', '1024')
    def test_region_bounds(self, region):
        t = transfer.Transfer.from_metadata(
            VOLUME_ID, metadata(region_sectors=region))
        self.assertEqual(int(region), t.region_sectors)

    def test_ipv6_portal_and_iqn_without_suffix(self):
        t = transfer.Transfer.from_metadata(VOLUME_ID, metadata(
            target_portal='[fd00::1]:3260',
            target_iqn='iqn.2010-10.org.openstack'))
        self.assertEqual('[fd00::1]:3260', t.target_portal)

    def test_metadata_keys(self):
        keys = transfer.Transfer.metadata_keys()
        self.assertIn('dmclone_state', keys)
        self.assertIn('dmclone_percent', keys)
        self.assertIn('dmclone_eta_seconds', keys)
        self.assertIn('dmclone_stalled_seconds', keys)
        self.assertIn('dmclone_secret', keys)
        self.assertIn('dmclone_source_aliases', keys)
        self.assertEqual(len(transfer.Transfer.FIELDS)
                         + len(transfer.Transfer.OPTIONAL_FIELDS)
                         + len(transfer.PROGRESS_KEYS), len(set(keys)))

    def test_optional_fields_round_trip(self):
        t = make_transfer(source_aliases=('node-a.example', 'node-a2'),
                          secret='ab' * 16)
        md = t.to_metadata()
        self.assertEqual('node-a.example,node-a2',
                         md['dmclone_source_aliases'])
        back = transfer.Transfer.from_metadata(VOLUME_ID, md)
        self.assertEqual(t, back)
        self.assertEqual({'node-a', 'node-a.example', 'node-a2'},
                         back.source_names)

    def test_record_of_release_1_1_0_loads(self):
        md = metadata()
        del md['dmclone_secret'], md['dmclone_source_aliases']
        t = transfer.Transfer.from_metadata(VOLUME_ID, md)
        self.assertEqual(('', ()), (t.secret, t.source_aliases))
        self.assertFalse(t.authentic(''))
        self.assertFalse(t.same_transfer(t))

    @ddt.data(('secret', 'not-hex-' * 5), ('secret', 'ab'),
              ('secret', 'AB' * 16), ('source_aliases', 'a b'),
              ('source_aliases', 'ok,bad/one'))
    @ddt.unpack
    def test_bad_optional_field(self, field, value):
        self.assertRaises(transfer.TransferStateInvalid,
                          transfer.Transfer.from_metadata, VOLUME_ID,
                          metadata(**{field: value}))

    def test_authentic(self):
        t = make_transfer(secret='ab' * 16)
        self.assertTrue(t.authentic('ab' * 16))
        for other in ('ab' * 15, 'cd' * 16, '', None, 42, 'ab' * 16 + 'x'):
            self.assertFalse(t.authentic(other))

    def test_source_properties_without_auth(self):
        self.assertEqual({'target_portal': PORTAL, 'target_iqn': IQN,
                          'target_lun': 0, 'target_portals': [PORTAL],
                          'target_iqns': [IQN], 'target_luns': [0],
                          'target_discovered': False,
                          'volume_id': VOLUME_ID},
                         make_transfer().source_properties())
        self.assertNotIn('auth_method',
                         make_transfer().source_properties(''))

    def test_source_properties_with_auth(self):
        props = make_transfer(target_lun=2).source_properties(
            'CHAP user pass word')
        self.assertEqual('CHAP', props['auth_method'])
        self.assertEqual('user', props['auth_username'])
        # The secret is everything after the user name.
        self.assertEqual('pass word', props['auth_password'])
        self.assertEqual(2, props['target_lun'])

    def test_source_properties_spare_os_brick_the_discovery_db(self):
        # os-brick's disconnect path with these properties: the targets
        # come from them, no iscsiadm discovery-database query (which
        # exits 21 and logs an ERROR when the database is empty).
        conn = iscsi.ISCSIConnector(None, execute=mock.Mock(
            side_effect=AssertionError('iscsiadm must not run')))
        props = make_transfer(target_lun=3).source_properties('CHAP u p')
        self.assertEqual(
            [(PORTAL, IQN, 3)],
            conn._get_ips_iqns_luns(props, discover=False,
                                    is_disconnect_call=True))

    @ddt.data((None, '0.0'), ({}, '0.0'), ({'dmclone_percent': '42.5'},
                                           '42.5'))
    @ddt.unpack
    def test_progress_percent(self, md, percent):
        self.assertEqual(percent, transfer.progress_percent(md))

    def test_in_progress_message(self):
        exc = transfer.TransferInProgress(
            volume_name=LV, source='node-a', dest='node-b',
            state='hydrating', percent='42.0', action='a snapshot')
        self.assertEqual(
            'Volume %s is moving from node-a to node-b (hydrating, 42.0%% '
            'hydrated): a snapshot is possible once the transfer has '
            'finished.' % LV, str(exc))
        self.assertIsInstance(exc, exception.VolumeIsBusy)


class StoreTestCase(test.TestCase):

    def setUp(self):
        super().setUp()
        self.ctxt = context.get_admin_context()
        self.db = fakes.FakeDB()
        self.db.volumes[VOLUME_ID] = {'host': 'node-a@dmclone#dmclone',
                                      'availability_zone': 'az-a'}
        self.db.admin_metadata[VOLUME_ID] = {'readonly': 'False'}
        self.store = transfer.Store(self.db)

    def test_load_nothing(self):
        self.assertIsNone(self.store.load(self.ctxt, VOLUME_ID))

    def test_save_and_load(self):
        t = make_transfer()
        self.store.save(self.ctxt, t)
        self.assertEqual(t, self.store.load(self.ctxt, VOLUME_ID))
        # Other admin metadata is kept, the update does not delete.
        self.assertEqual('False',
                         self.db.admin_metadata[VOLUME_ID]['readonly'])
        self.assertEqual(('volume_admin_metadata_update', VOLUME_ID,
                          t.to_metadata(), False), self.db.calls[-2])

    def test_transition(self):
        t = make_transfer()
        self.store.save(self.ctxt, t)
        del self.db.calls[:]
        self.store.transition(self.ctxt, t, (transfer.PREPARING,),
                              transfer.CLONED)
        self.assertEqual(transfer.CLONED, t.state)
        self.assertEqual([('volume_admin_metadata_update', VOLUME_ID,
                           {'dmclone_state': 'cloned'}, False)],
                         [c for c in self.db.calls
                          if c[0] == 'volume_admin_metadata_update'])
        self.assertEqual(transfer.CLONED,
                         self.store.load(self.ctxt, VOLUME_ID).state)

    def test_progress_of_an_earlier_move_is_not_shown_for_a_new_one(self):
        # A clear cut short by a crash left the old move's progress.
        # (Before: the next move showed it as its own.)
        self.db.admin_metadata[VOLUME_ID] = {'dmclone_percent': '87.5',
                                             'dmclone_eta_seconds': '12',
                                             'readonly': 'False'}
        self.store.save(self.ctxt, make_transfer())
        md = self.db.admin_metadata[VOLUME_ID]
        self.assertNotIn('dmclone_percent', md)
        self.assertNotIn('dmclone_eta_seconds', md)
        self.assertEqual('False', md['readonly'])
        self.assertEqual('0', transfer.progress_percent(md)[0])

    def test_old_progress_deleted_meanwhile_is_fine(self):
        self.db.admin_metadata[VOLUME_ID] = {'dmclone_percent': '87.5'}
        self.mock_object(self.db, 'volume_admin_metadata_delete',
                         side_effect=exception.CinderException('gone'))
        t = make_transfer()
        self.store.save(self.ctxt, t)
        self.assertEqual(t, self.store.load(self.ctxt, VOLUME_ID))

    def test_save_gives_a_fresh_secret(self):
        t, u = make_transfer(), make_transfer()
        self.store.save(self.ctxt, t)
        self.store.save(self.ctxt, u)
        self.assertEqual(32, len(t.secret))
        self.assertNotEqual(t.secret, u.secret)

    def test_transition_from_an_unexpected_state_writes_nothing(self):
        t = make_transfer()
        self.store.save(self.ctxt, t)
        exc = self.assertRaises(
            transfer.TransferStateConflict, self.store.transition,
            self.ctxt, t, (transfer.CLONED,), transfer.HYDRATING)
        self.assertIn('expected cloned, found preparing', str(exc))
        self.assertEqual(transfer.PREPARING,
                         self.store.load(self.ctxt, VOLUME_ID).state)

    def test_transition_of_a_cleared_move_writes_nothing(self):
        # The race the review found: a state written after a clear left
        # a lone dmclone_state that broke every later attach.
        t = make_transfer()
        self.store.save(self.ctxt, t)
        self.store.clear(self.ctxt, VOLUME_ID)
        self.assertRaises(transfer.TransferStateConflict,
                          self.store.transition, self.ctxt, t,
                          (transfer.PREPARING,), transfer.CLONED)
        self.assertNotIn('dmclone_state',
                         self.db.admin_metadata.get(VOLUME_ID, {}))

    def test_transition_of_a_replaced_move_writes_nothing(self):
        old, new = make_transfer(), make_transfer()
        self.store.save(self.ctxt, old)
        self.store.save(self.ctxt, new)
        self.assertRaises(transfer.TransferStateConflict,
                          self.store.transition, self.ctxt, old,
                          (transfer.PREPARING,), transfer.ABORTED)
        self.assertEqual(new, self.store.load(self.ctxt, VOLUME_ID))

    def test_clear_of_a_replaced_move_keeps_the_new_one(self):
        old, new = make_transfer(), make_transfer()
        self.store.save(self.ctxt, old)
        self.store.save(self.ctxt, new)
        self.store.clear(self.ctxt, VOLUME_ID, old)
        self.assertEqual(new, self.store.load(self.ctxt, VOLUME_ID))
        self.store.clear(self.ctxt, VOLUME_ID, new)
        self.assertIsNone(self.store.load(self.ctxt, VOLUME_ID))

    def test_ensure_secret(self):
        t = make_transfer()
        self.store.save(self.ctxt, t)
        secret = t.secret
        self.store.ensure_secret(self.ctxt, t)
        self.assertEqual(secret, t.secret)
        t.secret = ''
        self.store.ensure_secret(self.ctxt, t)
        self.assertNotEqual(secret, t.secret)
        self.assertEqual(t.secret,
                         self.store.load(self.ctxt, VOLUME_ID).secret)

    def test_publish_progress(self):
        t = make_transfer()
        self.store.save(self.ctxt, t)
        self.store.publish_progress(self.ctxt, VOLUME_ID, periodic.Progress(
            hydrated_regions=4096, total_regions=16384, region_bytes=65536,
            rate=1048576.0, eta=768.0))
        md = self.db.admin_metadata[VOLUME_ID]
        self.assertEqual('25.0', md['dmclone_percent'])
        self.assertEqual('4096', md['dmclone_hydrated_regions'])
        self.assertEqual('16384', md['dmclone_total_regions'])
        self.assertEqual('1048576', md['dmclone_rate_bps'])
        self.assertEqual('768', md['dmclone_eta_seconds'])
        self.assertEqual('25.0', transfer.progress_percent(md))
        # Progress does not disturb the transfer itself.
        self.assertEqual(t, self.store.load(self.ctxt, VOLUME_ID))

    def test_clear(self):
        self.store.save(self.ctxt, make_transfer())
        self.store.publish_progress(self.ctxt, VOLUME_ID,
                                    periodic.Progress(1, 2, 512))
        del self.db.calls[:]
        self.store.clear(self.ctxt, VOLUME_ID)
        self.assertEqual({'readonly': 'False'},
                         self.db.admin_metadata[VOLUME_ID])
        self.assertIsNone(self.store.load(self.ctxt, VOLUME_ID))
        # The state goes first: a crash part-way leaves inert keys only.
        self.assertEqual(('volume_admin_metadata_delete', VOLUME_ID,
                          'dmclone_state'), self.db.calls[0])

    def test_clear_interrupted_leaves_no_transfer(self):
        self.store.save(self.ctxt, make_transfer())
        real = self.db.volume_admin_metadata_delete
        calls = []

        def die_after_first(ctxt, volume_id, key):
            if calls:
                raise KeyboardInterrupt()
            calls.append(key)
            real(ctxt, volume_id, key)
        self.db.volume_admin_metadata_delete = die_after_first
        self.assertRaises(KeyboardInterrupt, self.store.clear, self.ctxt,
                          VOLUME_ID)
        self.assertIsNone(self.store.load(self.ctxt, VOLUME_ID))

    def test_clear_ignores_cinder_errors(self):
        self.store.save(self.ctxt, make_transfer())
        self.db.fail_on['volume_admin_metadata_delete'] = \
            exception.VolumeNotFound(volume_id=VOLUME_ID)
        self.store.clear(self.ctxt, VOLUME_ID)
        deletes = [c for c in self.db.calls
                   if c[0] == 'volume_admin_metadata_delete']
        self.assertEqual(len(transfer.Transfer.metadata_keys()),
                         len(deletes))

    def test_clear_raises_other_errors(self):
        self.db.fail_on['volume_admin_metadata_delete'] = ValueError('x')
        self.assertRaises(ValueError, self.store.clear, self.ctxt, VOLUME_ID)

    def test_clear_nothing(self):
        self.store.clear(self.ctxt, VOLUME_ID)
        self.assertEqual({'readonly': 'False'},
                         self.db.admin_metadata[VOLUME_ID])

    def test_move_volume(self):
        self.store.move_volume(self.ctxt, VOLUME_ID, 'node-b@dmclone#dmclone',
                               'az-b')
        self.assertEqual({'host': 'node-b@dmclone#dmclone',
                          'availability_zone': 'az-b'},
                         self.db.volumes[VOLUME_ID])

    def test_move_volume_keeps_zone(self):
        self.store.move_volume(self.ctxt, VOLUME_ID, 'node-b@dmclone#dmclone')
        self.assertEqual(('volume_update', VOLUME_ID,
                          {'host': 'node-b@dmclone#dmclone'}),
                         self.db.calls[-1])
        self.assertEqual('az-a',
                         self.db.volumes[VOLUME_ID]['availability_zone'])

    def test_load_of_deleted_volume(self):
        self.assertRaises(exception.VolumeNotFound, self.store.load,
                          self.ctxt, fake.VOLUME2_ID)


class DestinationNodeTestCase(test.TestCase):

    def setUp(self):
        super().setUp()
        self.dm = fakes.FakeDMSetup()
        self.dm.strict = True
        self.vg = fakes.FakeLVM(VG, self.dm)
        self.meta_vg = fakes.FakeLVM(META_VG, self.dm)
        self.source_sectors = SECTORS
        self.connector = fakes.FakeConnector(
            self.dm, lambda props: self.source_sectors)
        self.execute = mock.Mock(side_effect=self._execute)
        self.node = transfer.DestinationNode(
            self.dm, self.vg, self.meta_vg, self.connector, self.execute,
            'sudo cinder-rootwrap')
        self.t = make_transfer()

    def _execute(self, *cmd, **kwargs):
        if cmd[:3] == privileged.ENV_PREFIX + ('dd',):
            self.meta_vg.zero(cmd[4][3:])
        return '', ''

    def _build(self, hydrate=True, threshold=64, batch=16):
        self.node.create_volumes(self.t, 1)
        source = self.node.connect_source(self.t, None)
        return self.node.build_clone(self.t, source, hydrate, threshold,
                                     batch)

    # -- names -------------------------------------------------------------

    def test_names(self):
        self.assertEqual(HANDLE, self.node.handle_name(self.t))
        self.assertEqual(LV_PATH, self.node.lv_path(self.t))
        self.assertEqual(META_PATH, self.node.meta_path(self.t))

    # -- create_volumes ----------------------------------------------------

    def test_create_volumes(self):
        self.node.create_volumes(self.t, 1)
        self.assertEqual([('create_volume', LV, '1g', 'default')],
                         self.vg.calls)
        self.assertEqual([('create_volume', META, '8m', 'default')],
                         self.meta_vg.calls)
        self.execute.assert_called_once_with(
            '/usr/bin/env', 'LC_ALL=C', 'dd', 'if=/dev/zero',
            'of=%s' % META_PATH, 'bs=1M', 'count=1', 'oflag=direct',
            'conv=nocreat', run_as_root=True,
            root_helper='sudo cinder-rootwrap')
        self.assertEqual(1, self.meta_vg.lvs[META]['zeroed'])

    # -- check_space -------------------------------------------------------

    def test_check_space_passes_with_room(self):
        self.node.check_space(self.t, 1, 'node-b')
        self.assertEqual(1, self.vg.refreshed)
        self.assertEqual(1, self.meta_vg.refreshed)
        self.assertEqual([], self.vg.calls)

    def test_check_space_data_vg_full(self):
        self.vg.vg_free_space = 0.5
        exc = self.assertRaises(dmc_exception.DestinationFull,
                                self.node.check_space, self.t, 1, 'node-b')
        self.assertIn('node-b', str(exc))
        self.assertIn(VG, str(exc))
        self.assertIn('0.50 GiB free, 1.00 GiB needed', str(exc))
        self.assertEqual([], self.vg.calls)
        self.assertEqual([], self.meta_vg.calls)

    def test_check_space_metadata_vg_full(self):
        self.meta_vg.vg_free_space = 0.001
        exc = self.assertRaises(dmc_exception.DestinationFull,
                                self.node.check_space, self.t, 1, 'node-b')
        self.assertIn(META_VG, str(exc))

    def test_check_space_same_vg_counts_metadata(self):
        node = transfer.DestinationNode(self.dm, self.vg, self.vg,
                                        self.connector, self.execute, 'rh')
        self.vg.vg_free_space = 1.0   # the 8 MiB metadata LV does not fit
        self.assertRaises(dmc_exception.DestinationFull,
                          node.check_space, self.t, 1, 'node-b')
        self.vg.vg_free_space = 1.01
        node.check_space(self.t, 1, 'node-b')

    def test_check_space_skips_thin(self):
        self.node.lvm_type = 'thin'
        self.vg.vg_free_space = 0.0
        self.node.check_space(self.t, 1, 'node-b')
        self.assertEqual(0, self.vg.refreshed)

    def test_metadata_lv_created_first(self):
        order = []
        self.meta_vg.create_volume = mock.Mock(
            side_effect=lambda *a: order.append('meta'))
        self.vg.create_volume = mock.Mock(
            side_effect=lambda *a: order.append('data'))
        self.execute.side_effect = lambda *a, **k: order.append('dd')
        self.node.create_volumes(self.t, 1)
        self.assertEqual(['meta', 'dd', 'data'], order)

    def test_metadata_sized_by_layout(self):
        # 2 TiB in 4 KiB regions: a 64 MiB bitmap, doubled by the reserve.
        t = make_transfer(clone_sectors=4 * 1024 ** 3, region_sectors=8)
        self.node.metadata_reserve = 2.0
        self.node.create_volumes(t, 2048)
        expected = layout.metadata_size_bytes(2 * 1024 ** 4, 4096, 2.0)
        self.assertEqual(128 * 1024 ** 2, expected)
        self.assertEqual(('create_volume', META, '128m', 'default'),
                         self.meta_vg.calls[0])
        self.assertEqual(('create_volume', LV, '2048g', 'default'),
                         self.vg.calls[0])

    def test_lvm_type(self):
        self.node.lvm_type = 'thin'
        self.node.create_volumes(self.t, 1)
        self.assertEqual(('create_volume', LV, '1g', 'thin'),
                         self.vg.calls[0])
        # The metadata LV is always thick.
        self.assertEqual('default', self.meta_vg.calls[0][3])

    def test_create_volumes_is_idempotent_and_never_rezeroes(self):
        self.node.create_volumes(self.t, 1)
        self.node.create_volumes(self.t, 1)
        self.assertEqual(1, self.execute.call_count)
        self.assertEqual(1, len(self.vg.calls))
        self.assertEqual(1, len(self.meta_vg.calls))
        self.assertEqual(1, self.meta_vg.lvs[META]['zeroed'])

    def test_existing_metadata_is_not_zeroed(self):
        self.meta_vg.add(META, '8m', complete=False)
        self.node.create_volumes(self.t, 1)
        self.execute.assert_not_called()
        self.assertEqual([('create_volume', LV, '1g', 'default')],
                         self.vg.calls)

    def test_existing_data_lv_is_kept(self):
        self.vg.add(LV, '1g')
        self.node.create_volumes(self.t, 1)
        self.assertEqual([], self.vg.calls)
        self.execute.assert_called_once()

    def test_zero_failure_propagates(self):
        self.execute.side_effect = exception.VolumeBackendAPIException(
            data='dd failed')
        self.assertRaises(exception.VolumeBackendAPIException,
                          self.node.create_volumes, self.t, 1)
        # The data LV is only created once the metadata LV is ready.
        self.assertNotIn(LV, self.vg.lvs)

    # -- source ------------------------------------------------------------

    def test_connect_source(self):
        self.assertEqual(SOURCE, self.node.connect_source(
            self.t, 'CHAP user secret'))
        props = self.connector.calls[0][1]
        self.assertEqual('CHAP', props['auth_method'])
        self.assertEqual(IQN, props['target_iqn'])
        self.assertEqual({IQN: SOURCE}, self.connector.sessions)

    def test_connect_bigger_source(self):
        self.source_sectors = SECTORS + 8192
        self.assertEqual(SOURCE, self.node.connect_source(self.t, None))

    def test_connect_source_too_small(self):
        self.source_sectors = SECTORS - 8
        exc = self.assertRaises(dmc_exception.InvalidTable,
                                self.node.connect_source, self.t, None)
        self.assertIn('has %d sectors, the clone needs %d'
                      % (SECTORS - 8, SECTORS), str(exc))
        self.assertEqual({}, self.connector.sessions)
        op, props, info, force, ignore = self.connector.calls[-1]
        self.assertEqual('disconnect_volume', op)
        self.assertEqual({'type': 'block', 'path': SOURCE}, info)
        self.assertTrue(force)
        self.assertTrue(ignore)

    def test_disconnect_source(self):
        self.node.connect_source(self.t, None)
        self.node.disconnect_source(self.t, None)
        self.node.disconnect_source(self.t, None)
        self.assertEqual({}, self.connector.sessions)
        self.assertEqual(('disconnect_volume', self.t.source_properties(),
                          None, True, True), self.connector.calls[-1])

    # -- tables ------------------------------------------------------------

    def test_clone_table_one_segment(self):
        self.node.create_volumes(self.t, 1)
        table = self.node.clone_table(self.t, SOURCE, hydrate=False,
                                      threshold=64, batch_size=16)
        self.assertEqual([dmsetup.clone_segment(
            0, SECTORS, META_PATH, LV_PATH, SOURCE, REGION, hydration=False,
            hydration_threshold=64, hydration_batch_size=16)], table)

    def test_clone_table_with_linear_tail(self):
        self.node.create_volumes(self.t, 2)
        table = self.node.clone_table(self.t, SOURCE, hydrate=True)
        self.assertEqual([
            dmsetup.clone_segment(0, SECTORS, META_PATH, LV_PATH,
                                  SOURCE, REGION, hydration=True),
            dmsetup.linear_segment(SECTORS, SECTORS, LV_PATH, SECTORS)],
            table)

    def test_build_clone(self):
        self.assertEqual(HANDLE_PATH, self._build(hydrate=False))
        self.assertEqual(layout.handle_uuid(VG, LV), self.dm.uuids[HANDLE])
        args = dmsetup.parse_clone_table(self.dm.devices[HANDLE][0])
        self.assertEqual(('no_hydration',), args.features)
        self.assertEqual({'hydration_threshold': 64,
                          'hydration_batch_size': 16}, args.core_args)
        self.assertEqual(SOURCE, args.source_dev)

    def test_build_clone_is_idempotent(self):
        self._build()
        table = self.dm.devices[HANDLE]
        self.assertEqual(HANDLE_PATH, self.node.build_clone(
            self.t, SOURCE, False))
        self.assertEqual(table, self.dm.devices[HANDLE])
        self.assertEqual(1, [c[0] for c in self.dm.calls].count('create'))

    def test_build_clone_refuses_to_replace_linear_handle(self):
        self.node.create_volumes(self.t, 1)
        self.dm.devices[HANDLE] = [dmsetup.linear_segment(0, SECTORS,
                                                          LV_PATH)]
        exc = self.assertRaises(dmc_exception.InvalidTable,
                                self.node.build_clone, self.t, SOURCE, True)
        self.assertIn('refusing to replace', str(exc))
        self.assertEqual('linear', self.dm.devices[HANDLE][0].target)

    def test_build_clone_needs_its_devices(self):
        # No metadata LV: the kernel would refuse the table.
        self.assertRaises(dmc_exception.DMSetupCommandFailed,
                          self.node.build_clone, self.t, SOURCE, True)
        self.assertNotIn(HANDLE, self.dm.devices)

    def test_enable_hydration_and_tune(self):
        self._build(hydrate=False)
        self.node.enable_hydration(self.t)
        self.node.tune(self.t, 128, 32)
        messages = [c[1:] for c in self.dm.calls if c[0] == 'message']
        self.assertEqual([(HANDLE, 'enable_hydration'),
                          (HANDLE, 'hydration_threshold', 128),
                          (HANDLE, 'hydration_batch_size', 32)], messages)
        self.assertTrue(self.dm.status(HANDLE)[0].clone.hydration_enabled)

    # -- extend ------------------------------------------------------------

    def _extend_lv(self):
        self.vg.extend_volume(LV, '2g')

    def test_extend_keeps_hydration_and_core_args(self):
        self._build(hydrate=False, threshold=32, batch=8)
        self.node.enable_hydration(self.t)
        self._extend_lv()
        self.assertTrue(self.node.extend(self.t))
        table = self.dm.devices[HANDLE]
        self.assertEqual(2, len(table))
        self.assertEqual(dmsetup.clone_segment(
            0, SECTORS, META_PATH, LV_PATH, SOURCE, REGION, hydration=True,
            hydration_threshold=32, hydration_batch_size=8), table[0])
        self.assertEqual(dmsetup.linear_segment(SECTORS, SECTORS, LV_PATH,
                                                SECTORS), table[1])
        self.assertTrue(self.dm.status(HANDLE)[0].clone.hydration_enabled)

    def test_extend_keeps_hydration_off(self):
        self._build(hydrate=False)
        self._extend_lv()
        self.assertTrue(self.node.extend(self.t))
        args = dmsetup.parse_clone_table(self.dm.devices[HANDLE][0])
        self.assertIn('no_hydration', args.features)
        self.assertEqual(2 * SECTORS,
                         dmsetup.table_length(self.dm.devices[HANDLE]))

    def test_extend_without_clone(self):
        self.vg.add(LV, '1g')
        self.dm.devices[HANDLE] = [dmsetup.linear_segment(0, SECTORS,
                                                          LV_PATH)]
        self.assertFalse(self.node.extend(self.t))
        self.assertNotIn('load', [c[0] for c in self.dm.calls])

    # -- finish ------------------------------------------------------------

    def test_hydrated(self):
        self.assertFalse(self.node.hydrated(self.t))
        self._build()
        self.assertFalse(self.node.hydrated(self.t))
        self.dm.hydrate(HANDLE, 100)
        self.assertFalse(self.node.hydrated(self.t))
        self.dm.hydrate(HANDLE)
        self.assertTrue(self.node.hydrated(self.t))

    def test_hydrated_when_linear(self):
        self.dm.devices[HANDLE] = [dmsetup.linear_segment(0, 8, LV_PATH)]
        self.assertTrue(self.node.hydrated(self.t))

    def test_swap_refuses_before_fully_hydrated(self):
        self._build()
        self.dm.hydrate(HANDLE, 16383)
        table = self.dm.devices[HANDLE]
        exc = self.assertRaises(dmc_exception.InvalidTable,
                                self.node.swap_to_linear, self.t)
        self.assertIn('before it is fully hydrated', str(exc))
        self.assertEqual(table, self.dm.devices[HANDLE])
        self.assertNotIn('load', [c[0] for c in self.dm.calls])

    def test_swap_refuses_with_hydration_off(self):
        self._build(hydrate=False)
        self.dm.hydrate(HANDLE)
        self.assertRaises(dmc_exception.InvalidTable,
                          self.node.swap_to_linear, self.t)

    def test_swap_to_linear(self):
        self._build()
        self._extend_lv()
        self.node.extend(self.t)
        self.dm.hydrate(HANDLE)
        before = len(self.dm.calls)
        self.node.swap_to_linear(self.t)
        self.assertEqual([dmsetup.linear_segment(0, 2 * SECTORS, LV_PATH)],
                         self.dm.devices[HANDLE])
        # Swapped live (load, then resume), never removed.
        self.assertEqual(['load', 'resume'],
                         [c[0] for c in self.dm.calls[before:]
                          if c[0] in ('load', 'suspend', 'resume',
                                      'remove', 'create')])

    def test_swap_is_idempotent_once_linear(self):
        self._build()
        self.dm.hydrate(HANDLE)
        self.node.swap_to_linear(self.t)
        loads = [c[0] for c in self.dm.calls].count('load')
        self.node.swap_to_linear(self.t)
        self.assertEqual(loads, [c[0] for c in self.dm.calls].count('load'))

    def test_swap_without_handle_and_metadata(self):
        # Swapped and cleaned up before a reboot: nothing left to do.
        self.vg.add(LV, '1g')
        self.node.swap_to_linear(self.t)
        self.assertEqual({}, self.dm.devices)

    def test_swap_without_handle_but_metadata(self):
        self._build()
        self.dm.devices.clear()
        self.assertTrue(self.node.needs_rebuild(self.t))
        exc = self.assertRaises(dmc_exception.InvalidTable,
                                self.node.swap_to_linear, self.t)
        self.assertIn('must be rebuilt', str(exc))

    def test_needs_rebuild(self):
        self.assertFalse(self.node.needs_rebuild(self.t))
        self._build()
        self.assertFalse(self.node.needs_rebuild(self.t))
        self.assertTrue(self.node.has_metadata(self.t))

    def test_remove_metadata(self):
        self.node.create_volumes(self.t, 1)
        self.node.remove_metadata(self.t)
        self.node.remove_metadata(self.t)
        self.assertEqual({}, self.meta_vg.lvs)
        self.assertEqual([LV], list(self.vg.lvs))
        self.assertFalse(self.node.has_metadata(self.t))

    def test_tear_down(self):
        self._build()
        order = []
        self.connector.on_disconnect = lambda path: order.append(
            ('disconnect', HANDLE in self.dm.devices))
        self.node.tear_down(self.t, 'CHAP user secret')
        self.assertEqual([('disconnect', False)], order)
        self.assertEqual({}, self.dm.devices)
        self.assertEqual({}, self.connector.sessions)
        self.assertEqual({}, self.vg.lvs)
        self.assertEqual({}, self.meta_vg.lvs)

    def test_tear_down_removes_the_data_lv_wiped_before_the_metadata(self):
        # While the metadata LV exists nothing maps the partly hydrated
        # LV linear; a crash between the two removals must leave the
        # metadata LV.  The data LV is wiped first (volume_clear): its
        # extents go to the next LV of the group.  (Before: metadata LV
        # first, and no wipe at all.)
        self._build()
        events = []
        self.node.discard = lambda name: (
            events.append(('discard', name, META in self.meta_vg.lvs)),
            self.vg.delete(name))
        delete_meta = self.meta_vg.delete
        self.mock_object(self.meta_vg, 'delete', side_effect=lambda name: (
            events.append(('delete', name)), delete_meta(name)))
        self.node.tear_down(self.t, None)
        self.assertEqual([('discard', LV, True), ('delete', META)], events)

    def test_written(self):
        self._build(hydrate=False)
        self.assertFalse(self.node.written(self.t))
        self.dm.write(HANDLE, 1)
        self.assertTrue(self.node.written(self.t))
        # No clone to ask (a reboot): never assume it holds nothing.
        self.dm.remove(HANDLE)
        self.assertTrue(self.node.written(self.t))

    def test_tear_down_is_idempotent(self):
        self.node.tear_down(self.t, None)
        self._build()
        self.node.tear_down(self.t, None)
        self.node.tear_down(self.t, None)
        self.assertEqual({}, self.vg.lvs)
        self.assertEqual(1, [c[0] for c in self.vg.calls].count('delete'))
