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

"""A move's persisted record and its Store."""

from unittest import mock

import ddt

from cinder import context
from cinder import exception
from cinder.tests.unit import fake_constants as fake
from cinder.tests.unit import test
from os_brick.initiator.connectors import iscsi

from cinder_dmclone import hydration
from cinder_dmclone import move
from tests.unit import fakes

VOLUME_ID = fake.VOLUME_ID
LV = 'volume-%s' % VOLUME_ID
SECTORS = 2097152          # 1 GiB
REGION = 128               # 64 KiB
IQN = 'iqn.2010-10.org.openstack:%s' % LV
PORTAL = '10.0.0.1:3260'


def make_move(**overrides):
    values = dict(volume_id=VOLUME_ID, lv_name=LV, state=move.PREPARING,
                  source_host='node-a@dmclone#dmclone',
                  dest_host='node-b@dmclone#dmclone', source_node='node-a',
                  dest_node='node-b', region_sectors=REGION,
                  clone_sectors=SECTORS, target_portal=PORTAL,
                  target_iqn=IQN, target_lun=0)
    values.update(overrides)
    return move.Move(**values)


def metadata(**overrides):
    md = make_move().to_metadata()
    for key, value in overrides.items():
        if value is None:
            md.pop('dmclone_' + key)
        else:
            md['dmclone_' + key] = value
    return md


@ddt.ddt
class MoveRecordTestCase(test.TestCase):

    def test_round_trip(self):
        t = make_move(state=move.HYDRATING, target_lun=3,
                      prepared_at=1790000000, prepare_deadline=1790000165)
        md = t.to_metadata()
        self.assertEqual(set('dmclone_' + f for f in move.Move.FIELDS
                             + move.Move.OPTIONAL_FIELDS),
                         set(md))
        self.assertTrue(all(isinstance(v, str) for v in md.values()))
        self.assertEqual('3', md['dmclone_target_lun'])
        self.assertEqual(t, move.Move.from_metadata(VOLUME_ID, md))

    def test_undated_record_round_trip(self):
        # (A move recorded by an older release has no start time.)
        md = make_move().to_metadata()
        self.assertNotIn('dmclone_prepared_at', md)
        self.assertIsNone(
            move.Move.from_metadata(VOLUME_ID, md).prepared_at)

    @ddt.data('soon', '-1')
    def test_bad_start_time_refused(self, value):
        md = make_move().to_metadata()
        md['dmclone_prepared_at'] = value
        self.assertRaises(move.MoveStateInvalid, move.Move.from_metadata,
                          VOLUME_ID, md)

    def test_deadline_before_the_start_refused(self):
        md = make_move(prepared_at=1790000000,
                       prepare_deadline=1789999999).to_metadata()
        self.assertRaises(move.MoveStateInvalid, move.Move.from_metadata,
                          VOLUME_ID, md)

    def test_save_records_the_deadline_of_its_attempt(self):
        db = mock.Mock()
        db.volume_admin_metadata_get.return_value = {}
        store = move.Store(db, clock=lambda: 1790000000.7)
        t = make_move()
        store.save(context.get_admin_context(), t, budget=165)
        written = db.volume_admin_metadata_update.call_args[0][2]
        self.assertEqual(('1790000000', '1790000165'),
                         (written['dmclone_prepared_at'],
                          written['dmclone_prepare_deadline']))
        self.assertEqual(165, move.Move.from_metadata(
            VOLUME_ID, written).prepare_budget)
        self.assertIsNone(make_move(prepared_at=1).prepare_budget)

    def test_save_records_the_start_time(self):
        db = mock.Mock()
        db.volume_admin_metadata_get.return_value = {}
        now = [1790000000.7]
        store = move.Store(db, clock=lambda: now[0])
        t = make_move()
        store.save(context.get_admin_context(), t)
        self.assertEqual(1790000000, t.prepared_at)
        written = db.volume_admin_metadata_update.call_args[0][2]
        self.assertEqual('1790000000', written['dmclone_prepared_at'])
        now[0] += 30
        self.assertAlmostEqual(30.7, store.prepare_age(t))
        self.assertIsNone(store.prepare_age(make_move()))

    @ddt.data(None, {}, {'readonly': 'True'},
              {'dmclone_percent': '42.0', 'dmclone_lv_name': LV})
    def test_no_state_no_move(self, md):
        self.assertIsNone(move.Move.from_metadata(VOLUME_ID, md))

    def test_other_admin_metadata_is_ignored(self):
        md = dict(metadata(), readonly='True', attached_mode='rw')
        self.assertEqual(make_move(),
                         move.Move.from_metadata(VOLUME_ID, md))

    @ddt.data(*[f for f in move.Move.FIELDS if f != 'state'])
    def test_missing_field(self, field):
        exc = self.assertRaises(move.MoveStateInvalid,
                                move.Move.from_metadata, VOLUME_ID,
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
        exc = self.assertRaises(move.MoveStateInvalid,
                                move.Move.from_metadata, VOLUME_ID,
                                metadata(**{field: value}))
        self.assertIn(message, str(exc))
        self.assertIn(VOLUME_ID, str(exc))

    @ddt.data('region_sectors', 'clone_sectors', 'target_lun')
    def test_non_string_integer(self, field):
        md = metadata()
        md['dmclone_' + field] = [1]
        self.assertRaises(move.MoveStateInvalid,
                          move.Move.from_metadata, VOLUME_ID, md)

    @ddt.data('target_iqn', 'target_portal', 'source_host', 'dest_node')
    def test_non_string_text(self, field):
        md = metadata()
        md['dmclone_' + field] = 5
        exc = self.assertRaises(move.MoveStateInvalid,
                                move.Move.from_metadata, VOLUME_ID,
                                md)
        self.assertIn('%s=5 is malformed' % field, str(exc))

    def test_same_source_and_dest(self):
        exc = self.assertRaises(
            move.MoveStateInvalid, move.Move.from_metadata,
            VOLUME_ID, metadata(dest_host='node-a@dmclone#dmclone'))
        self.assertIn('source and destination are the same host', str(exc))

    @ddt.data(*move.STATES)
    def test_every_state(self, state):
        t = move.Move.from_metadata(VOLUME_ID, metadata(state=state))
        self.assertEqual(state, t.state)

    @ddt.data('8', '2097152', '1024')
    def test_region_bounds(self, region):
        t = move.Move.from_metadata(
            VOLUME_ID, metadata(region_sectors=region))
        self.assertEqual(int(region), t.region_sectors)

    def test_ipv6_portal_and_iqn_without_suffix(self):
        t = move.Move.from_metadata(VOLUME_ID, metadata(
            target_portal='[fd00::1]:3260',
            target_iqn='iqn.2010-10.org.openstack'))
        self.assertEqual('[fd00::1]:3260', t.target_portal)

    def test_metadata_keys(self):
        keys = move.Move.metadata_keys()
        self.assertIn('dmclone_state', keys)
        self.assertIn('dmclone_percent', keys)
        self.assertIn('dmclone_eta_seconds', keys)
        self.assertIn('dmclone_stalled_seconds', keys)
        self.assertIn('dmclone_secret', keys)
        self.assertIn('dmclone_source_aliases', keys)
        # (Cleared with the move: whether it recorded its export's ACL.)
        self.assertIn('dmclone_export_recorded', keys)
        self.assertNotIn(move.EXPORT_KEY, keys)
        # (And the mark of a thin-mapped clone, which goes with it.)
        self.assertIn('dmclone_thin_mapped', keys)
        self.assertEqual(len(move.Move.FIELDS)
                         + len(move.Move.OPTIONAL_FIELDS)
                         + len(move.PROGRESS_KEYS) + 2, len(set(keys)))

    def test_optional_fields_round_trip(self):
        t = make_move(source_aliases=('node-a.example', 'node-a2'),
                      secret='ab' * 16)
        md = t.to_metadata()
        self.assertEqual('node-a.example,node-a2',
                         md['dmclone_source_aliases'])
        back = move.Move.from_metadata(VOLUME_ID, md)
        self.assertEqual(t, back)
        self.assertEqual({'node-a', 'node-a.example', 'node-a2'},
                         back.source_names)

    def test_record_of_release_1_1_0_loads(self):
        md = metadata()
        del md['dmclone_secret'], md['dmclone_source_aliases']
        t = move.Move.from_metadata(VOLUME_ID, md)
        self.assertEqual(('', ()), (t.secret, t.source_aliases))
        self.assertFalse(t.authentic(''))
        self.assertFalse(t.same_move(t))

    @ddt.data(('secret', 'not-hex-' * 5), ('secret', 'ab'),
              ('secret', 'AB' * 16), ('source_aliases', 'a b'),
              ('source_aliases', 'ok,bad/one'))
    @ddt.unpack
    def test_bad_optional_field(self, field, value):
        self.assertRaises(move.MoveStateInvalid,
                          move.Move.from_metadata, VOLUME_ID,
                          metadata(**{field: value}))

    def test_authentic(self):
        t = make_move(secret='ab' * 16)
        self.assertTrue(t.authentic('ab' * 16))
        for other in ('ab' * 15, 'cd' * 16, '', None, 42, 'ab' * 16 + 'x'):
            self.assertFalse(t.authentic(other))

    def test_source_properties_without_auth(self):
        self.assertEqual({'target_portal': PORTAL, 'target_iqn': IQN,
                          'target_lun': 0, 'target_portals': [PORTAL],
                          'target_iqns': [IQN], 'target_luns': [0],
                          'target_discovered': False,
                          'volume_id': VOLUME_ID},
                         make_move().source_properties())
        self.assertNotIn('auth_method',
                         make_move().source_properties(''))

    def test_source_properties_with_auth(self):
        props = make_move(target_lun=2).source_properties(
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
        props = make_move(target_lun=3).source_properties('CHAP u p')
        self.assertEqual(
            [(PORTAL, IQN, 3)],
            conn._get_ips_iqns_luns(props, discover=False,
                                    is_disconnect_call=True))

    @ddt.data((None, '0.0'), ({}, '0.0'), ({'dmclone_percent': '42.5'},
                                           '42.5'))
    @ddt.unpack
    def test_progress_percent(self, md, percent):
        self.assertEqual(percent, move.progress_percent(md))

    def test_in_progress_message(self):
        exc = move.MoveInProgress(
            volume_name=LV, source='node-a', dest='node-b',
            state='hydrating', percent='42.0', action='a snapshot')
        self.assertEqual(
            'Volume %s is moving from node-a to node-b (hydrating, 42.0%% '
            'hydrated): a snapshot is possible once the move has '
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
        self.store = move.Store(self.db)

    def test_load_nothing(self):
        self.assertIsNone(self.store.load(self.ctxt, VOLUME_ID))

    def test_save_and_load(self):
        t = make_move()
        self.store.save(self.ctxt, t)
        self.assertEqual(t, self.store.load(self.ctxt, VOLUME_ID))
        # Other admin metadata is kept, the update does not delete.
        self.assertEqual('False',
                         self.db.admin_metadata[VOLUME_ID]['readonly'])
        self.assertEqual(('volume_admin_metadata_update', VOLUME_ID,
                          t.to_metadata(), False), self.db.calls[-2])

    def test_transition(self):
        t = make_move()
        self.store.save(self.ctxt, t)
        del self.db.calls[:]
        self.store.transition(self.ctxt, t, (move.PREPARING,),
                              move.CLONED)
        self.assertEqual(move.CLONED, t.state)
        self.assertEqual([('volume_admin_metadata_update', VOLUME_ID,
                           {'dmclone_state': 'cloned'}, False)],
                         [c for c in self.db.calls
                          if c[0] == 'volume_admin_metadata_update'])
        self.assertEqual(move.CLONED,
                         self.store.load(self.ctxt, VOLUME_ID).state)

    def recorded_with_a_deadline(self, elapsed):
        """A move saved with a 60 s budget ``elapsed`` seconds ago.

        Returns the store, the move and the store's clock ([seconds]).
        """
        now = [1000.0]
        store = move.Store(self.db, clock=lambda: now[0])
        t = make_move()
        store.save(self.ctxt, t, budget=60)
        now[0] += elapsed
        return store, t, now

    def test_commit_past_the_deadline_writes_nothing(self):
        store, t, _now = self.recorded_with_a_deadline(60)
        for state in (move.CLONED, move.HYDRATING):
            self.assertRaises(move.MoveDeadlinePassed, store.transition,
                              self.ctxt, t, (move.PREPARING,), state)
            self.assertEqual(move.PREPARING, t.state)
            self.assertEqual(move.PREPARING,
                             store.load(self.ctxt, VOLUME_ID).state)
        # Giving it up is never refused.
        store.transition(self.ctxt, t, (move.PREPARING,), move.ABORTED)
        self.assertEqual(move.ABORTED,
                         store.load(self.ctxt, VOLUME_ID).state)

    def test_commit_before_the_deadline_or_without_one(self):
        store, t, now = self.recorded_with_a_deadline(59.9)
        store.transition(self.ctxt, t, (move.PREPARING,), move.CLONED)
        self.assertEqual(move.CLONED, store.load(self.ctxt, VOLUME_ID).state)
        # (A move recorded by an older release has no deadline.)
        store.clear(self.ctxt, VOLUME_ID)
        t = make_move()
        store.save(self.ctxt, t)
        self.assertIsNone(store.load(self.ctxt, VOLUME_ID).prepare_deadline)
        now[0] += 10 ** 6
        store.transition(self.ctxt, t, (move.PREPARING,), move.HYDRATING)
        self.assertEqual(move.HYDRATING,
                         store.load(self.ctxt, VOLUME_ID).state)

    def test_roll_forward_past_the_deadline(self):
        # A committed move set back to preparing by a stale save (R14-4)
        # is no commit: the source's deadline does not apply.
        store, t, _now = self.recorded_with_a_deadline(10 ** 6)
        for state in (move.HYDRATING, move.CLONED):
            t.state = move.PREPARING
            store.db.volume_admin_metadata_update(
                self.ctxt, VOLUME_ID, {'dmclone_state': move.PREPARING},
                False)
            store.roll_forward(self.ctxt, t, state)
            self.assertEqual(state, t.state)
            self.assertEqual(state, store.load(self.ctxt, VOLUME_ID).state)

    def test_roll_forward_only_from_preparing(self):
        t = make_move()
        self.store.save(self.ctxt, t)
        self.store.roll_forward(self.ctxt, t, move.CLONED)
        # (A second caller, which read it preparing, writes nothing.)
        exc = self.assertRaises(move.MoveStateConflict,
                                self.store.roll_forward, self.ctxt, t,
                                move.HYDRATING)
        self.assertIn('expected preparing, found cloned', str(exc))
        self.assertEqual(move.CLONED,
                         self.store.load(self.ctxt, VOLUME_ID).state)

    def test_roll_forward_of_another_move_writes_nothing(self):
        old, new = make_move(), make_move()
        self.store.save(self.ctxt, old)
        self.store.save(self.ctxt, new)
        self.assertRaises(move.MoveStateConflict, self.store.roll_forward,
                          self.ctxt, old, move.HYDRATING)
        self.assertEqual(new, self.store.load(self.ctxt, VOLUME_ID))
        self.store.clear(self.ctxt, VOLUME_ID)
        self.assertRaises(move.MoveStateConflict, self.store.roll_forward,
                          self.ctxt, new, move.HYDRATING)
        self.assertNotIn('dmclone_state',
                         self.db.admin_metadata.get(VOLUME_ID, {}))

    def test_roll_forward_never_to_another_state(self):
        t = make_move()
        self.store.save(self.ctxt, t)
        for state in (move.PREPARING, move.ABORTED, move.SOURCE_LOST):
            self.assertRaises(ValueError, self.store.roll_forward,
                              self.ctxt, t, state)
        self.assertEqual(move.PREPARING,
                         self.store.load(self.ctxt, VOLUME_ID).state)

    def test_roll_forward_to_finalizing_only_from_preparing(self):
        # (A clone its destination swapped to linear already: R16-3.)
        t = make_move()
        self.store.save(self.ctxt, t)
        self.store.roll_forward(self.ctxt, t, move.FINALIZING)
        self.assertEqual(move.FINALIZING,
                         self.store.load(self.ctxt, VOLUME_ID).state)
        self.assertRaises(move.MoveStateConflict, self.store.roll_forward,
                          self.ctxt, t, move.FINALIZING)

    def test_progress_of_an_earlier_move_is_not_shown_for_a_new_one(self):
        # A clear cut short by a crash left the old move's progress.
        # (Before: the next move showed it as its own.)
        self.db.admin_metadata[VOLUME_ID] = {'dmclone_percent': '87.5',
                                             'dmclone_eta_seconds': '12',
                                             'readonly': 'False'}
        self.store.save(self.ctxt, make_move())
        md = self.db.admin_metadata[VOLUME_ID]
        self.assertNotIn('dmclone_percent', md)
        self.assertNotIn('dmclone_eta_seconds', md)
        self.assertEqual('False', md['readonly'])
        self.assertEqual('0', move.progress_percent(md)[0])

    def test_old_progress_deleted_meanwhile_is_fine(self):
        self.db.admin_metadata[VOLUME_ID] = {'dmclone_percent': '87.5'}
        self.mock_object(self.db, 'volume_admin_metadata_delete',
                         side_effect=exception.CinderException('gone'))
        t = make_move()
        self.store.save(self.ctxt, t)
        self.assertEqual(t, self.store.load(self.ctxt, VOLUME_ID))

    def test_save_gives_a_fresh_secret(self):
        t, u = make_move(), make_move()
        self.store.save(self.ctxt, t)
        self.store.save(self.ctxt, u)
        self.assertEqual(32, len(t.secret))
        self.assertNotEqual(t.secret, u.secret)

    def test_transition_from_an_unexpected_state_writes_nothing(self):
        t = make_move()
        self.store.save(self.ctxt, t)
        exc = self.assertRaises(
            move.MoveStateConflict, self.store.transition,
            self.ctxt, t, (move.CLONED,), move.HYDRATING)
        self.assertIn('expected cloned, found preparing', str(exc))
        self.assertEqual(move.PREPARING,
                         self.store.load(self.ctxt, VOLUME_ID).state)

    def test_transition_of_a_cleared_move_writes_nothing(self):
        # The race the review found: a state written after a clear left
        # a lone dmclone_state that broke every later attach.
        t = make_move()
        self.store.save(self.ctxt, t)
        self.store.clear(self.ctxt, VOLUME_ID)
        self.assertRaises(move.MoveStateConflict,
                          self.store.transition, self.ctxt, t,
                          (move.PREPARING,), move.CLONED)
        self.assertNotIn('dmclone_state',
                         self.db.admin_metadata.get(VOLUME_ID, {}))

    def test_transition_of_a_replaced_move_writes_nothing(self):
        old, new = make_move(), make_move()
        self.store.save(self.ctxt, old)
        self.store.save(self.ctxt, new)
        self.assertRaises(move.MoveStateConflict,
                          self.store.transition, self.ctxt, old,
                          (move.PREPARING,), move.ABORTED)
        self.assertEqual(new, self.store.load(self.ctxt, VOLUME_ID))

    def test_clear_of_a_replaced_move_keeps_the_new_one(self):
        old, new = make_move(), make_move()
        self.store.save(self.ctxt, old)
        self.store.save(self.ctxt, new)
        self.store.clear(self.ctxt, VOLUME_ID, old)
        self.assertEqual(new, self.store.load(self.ctxt, VOLUME_ID))
        self.store.clear(self.ctxt, VOLUME_ID, new)
        self.assertIsNone(self.store.load(self.ctxt, VOLUME_ID))

    def test_ensure_secret(self):
        t = make_move()
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
        t = make_move()
        self.store.save(self.ctxt, t)
        self.store.publish_progress(self.ctxt, VOLUME_ID, hydration.Progress(
            hydrated_regions=4096, total_regions=16384, region_bytes=65536,
            rate=1048576.0, eta=768.0))
        md = self.db.admin_metadata[VOLUME_ID]
        self.assertEqual('25.0', md['dmclone_percent'])
        self.assertEqual('4096', md['dmclone_hydrated_regions'])
        self.assertEqual('16384', md['dmclone_total_regions'])
        self.assertEqual('1048576', md['dmclone_rate_bps'])
        self.assertEqual('768', md['dmclone_eta_seconds'])
        self.assertEqual('25.0', move.progress_percent(md))
        # Progress does not disturb the move itself.
        self.assertEqual(t, self.store.load(self.ctxt, VOLUME_ID))

    def test_clear(self):
        self.store.save(self.ctxt, make_move())
        self.store.publish_progress(self.ctxt, VOLUME_ID,
                                    hydration.Progress(1, 2, 512))
        del self.db.calls[:]
        self.store.clear(self.ctxt, VOLUME_ID)
        self.assertEqual({'readonly': 'False'},
                         self.db.admin_metadata[VOLUME_ID])
        self.assertIsNone(self.store.load(self.ctxt, VOLUME_ID))
        # The state goes first: a crash part-way leaves inert keys only.
        self.assertEqual(('volume_admin_metadata_delete', VOLUME_ID,
                          'dmclone_state'), self.db.calls[0])

    def test_clear_interrupted_leaves_no_move(self):
        self.store.save(self.ctxt, make_move())
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
        self.store.save(self.ctxt, make_move())
        self.db.fail_on['volume_admin_metadata_delete'] = \
            exception.VolumeNotFound(volume_id=VOLUME_ID)
        self.store.clear(self.ctxt, VOLUME_ID)
        deletes = [c for c in self.db.calls
                   if c[0] == 'volume_admin_metadata_delete']
        self.assertEqual(len(move.Move.metadata_keys()),
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


class EndTagTestCase(test.TestCase):
    """The value of a node's end mark: one move, one end."""

    def test_bound_to_the_move_and_its_end(self):
        a, b = 'ab' * 16, 'cd' * 16
        tags = {move.end_tag(a, move.END_SWAP),
                move.end_tag(a, move.END_ROLLBACK),
                move.end_tag(b, move.END_SWAP), move.thin_map_tag(a)}
        self.assertEqual(4, len(tags))
        self.assertEqual(move.end_tag(a, move.END_SWAP),
                         move.end_tag(a, move.END_SWAP))
        for tag in tags:
            self.assertNotIn(a, tag)
            self.assertEqual(32, len(tag))

    def test_no_other_end(self):
        self.assertRaises(ValueError, move.end_tag, 'ab' * 16, 'commit')


@ddt.ddt
class ThinMappedMarkTestCase(test.TestCase):
    """The record's mark of a clone thin mapped on its destination."""

    def setUp(self):
        super().setUp()
        self.ctxt = context.get_admin_context()
        self.db = fakes.FakeDB()
        self.db.volumes[VOLUME_ID] = {'host': 'node-a@dmclone#dmclone'}
        self.store = move.Store(self.db)
        self.t = make_move()
        self.store.save(self.ctxt, self.t)

    def load(self):
        return self.store.load(self.ctxt, VOLUME_ID)

    def marks(self):
        """Every thin-mapped mark in the record, old key or per move."""
        return {k: v for k, v in self.db.admin_metadata[VOLUME_ID].items()
                if k.startswith('dmclone_thin_mapped')}

    def test_a_new_move_is_not_mapped(self):
        self.assertFalse(self.load().thin_mapped)
        self.assertEqual({}, {k: v for k, v in self.t.to_metadata().items()
                              if k.startswith('dmclone_thin_mapped')})

    def test_marked_while_preparing(self):
        self.store.mark_thin_mapped(self.ctxt, self.t)
        self.assertTrue(self.t.thin_mapped)
        self.assertTrue(self.load().thin_mapped)
        # (Under a key of this move's own, never the secret itself: a
        # tag bound to it.)
        marks = self.marks()
        self.assertEqual([move.thin_mapped_key(self.t.secret)], list(marks))
        self.assertEqual(move.thin_map_tag(self.t.secret),
                         marks[move.thin_mapped_key(self.t.secret)])
        for key, value in marks.items():
            self.assertNotIn(self.t.secret, key + value)
            self.assertLessEqual(len(key), move.VALUE_LIMIT)
        # Later steps keep it; the move's end clears it.
        self.store.transition(self.ctxt, self.t, (move.PREPARING,),
                              move.HYDRATING)
        self.assertTrue(self.load().thin_mapped)
        self.store.clear(self.ctxt, VOLUME_ID, self.t)
        self.assertEqual({}, {k: v for k, v in
                              self.db.admin_metadata[VOLUME_ID].items()
                              if k.startswith('dmclone_')})

    @ddt.data(move.HYDRATING, move.ABORTED)
    def test_refused_past_preparing(self, state):
        self.store.transition(self.ctxt, self.t, (move.PREPARING,), state)
        self.assertRaises(move.MoveStateConflict,
                          self.store.mark_thin_mapped, self.ctxt, self.t)
        self.assertFalse(self.load().thin_mapped)

    def test_refused_for_another_move(self):
        self.store.clear(self.ctxt, VOLUME_ID)
        self.assertRaises(move.MoveStateConflict,
                          self.store.mark_thin_mapped, self.ctxt, self.t)
        later = make_move()
        self.store.save(self.ctxt, later)
        self.assertRaises(move.MoveStateConflict,
                          self.store.mark_thin_mapped, self.ctxt, self.t)
        self.assertFalse(self.load().thin_mapped)

    def test_a_mark_of_another_move_is_inert(self):
        self.store.mark_thin_mapped(self.ctxt, self.t)
        stale = self.marks()
        self.store.clear(self.ctxt, VOLUME_ID, self.t)
        later = make_move()
        self.store.save(self.ctxt, later)
        self.assertNotEqual(self.t.secret, later.secret)
        # (A late write of a move given up, after the save.)
        self.db.admin_metadata[VOLUME_ID].update(stale)
        self.assertFalse(self.load().thin_mapped)
        # (Under the later move's key or the old one, any other value.)
        md = self.db.admin_metadata[VOLUME_ID]
        for key in (move.thin_mapped_key(later.secret),
                    'dmclone_thin_mapped'):
            for value in ('x\xe9', list(stale.values())[0], ''):
                md[key] = value
                self.assertFalse(self.load().thin_mapped)
                del md[key]

    def test_a_new_move_drops_every_leftover_mark(self):
        self.store.mark_thin_mapped(self.ctxt, self.t)
        given_up = make_move(secret='cd' * 16)
        self.db.admin_metadata[VOLUME_ID].update({
            move.thin_mapped_key(given_up.secret):
                move.thin_map_tag(given_up.secret),
            'dmclone_thin_mapped': move.thin_map_tag(self.t.secret)})
        self.store.save(self.ctxt, make_move())
        self.assertEqual({}, self.marks())

    def test_clear_drops_every_leftover_mark(self):
        self.store.mark_thin_mapped(self.ctxt, self.t)
        # (A late mark of a move given up before this one was recorded.)
        given_up = make_move(secret='cd' * 16)
        self.db.admin_metadata[VOLUME_ID][
            move.thin_mapped_key(given_up.secret)] = move.thin_map_tag(
                given_up.secret)
        self.db.admin_metadata[VOLUME_ID]['dmclone_thin_mapped'] = 'x'
        self.store.clear(self.ctxt, VOLUME_ID, self.t)
        self.assertEqual({}, self.marks())

    def test_a_mark_of_the_previous_release_is_honoured(self):
        # (One key per volume; an upgrade during the move keeps its guard.)
        md = self.db.admin_metadata[VOLUME_ID]
        md['dmclone_thin_mapped'] = move.thin_map_tag(self.t.secret)
        self.assertTrue(self.load().thin_mapped)
        md['dmclone_thin_mapped'] = move.thin_map_tag('ef' * 16)
        self.assertFalse(self.load().thin_mapped)

    def test_keys_of_two_moves_differ(self):
        self.assertNotEqual(move.thin_mapped_key(self.t.secret),
                            move.thin_mapped_key('ab' * 16))
        self.assertTrue(move.thin_mapped_key(self.t.secret).startswith(
            move.THIN_MAPPED_PREFIX))

    def test_forgotten_for_this_move_only(self):
        self.store.mark_thin_mapped(self.ctxt, self.t)
        self.store.forget_thin_map(self.ctxt, self.t)
        self.assertFalse(self.t.thin_mapped)
        self.assertFalse(self.load().thin_mapped)
        self.store.mark_thin_mapped(self.ctxt, self.t)
        self.store.forget_thin_map(self.ctxt, make_move(secret='ab' * 16))
        self.assertTrue(self.load().thin_mapped)
