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

"""What recovery does about a move: recovery.plan as a table of cases.

Each row is what this node finds after a restart, a reboot or an abort
(the move's state and :class:`recovery.Facts`) and the one action that
keeps the volume's data and ends or resumes the move.  Below the table:
which facts Recovery gathers, and which side each action goes to; what
the actions then do on two nodes is test_two_nodes' business.
"""

from unittest import mock

import ddt

from cinder import context
from cinder import objects
from cinder.tests.unit import fake_constants as fake
from cinder.tests.unit import fake_volume
from cinder.tests.unit import test
from cinder.tests.unit import utils as tests_utils

from cinder_dmclone import clone
from cinder_dmclone import destination
from cinder_dmclone import exception as dmc_exception
from cinder_dmclone import move
from cinder_dmclone import recovery
from cinder_dmclone import source

A = recovery.Action
F = recovery.Facts
DEST = dict(source_here=False, dest_here=True)


def make_move(state):
    lv = 'volume-%s' % fake.VOLUME_ID
    return move.Move(
        volume_id=fake.VOLUME_ID, lv_name=lv, state=state,
        source_host='node-a@dmclone#dmclone',
        dest_host='node-b@dmclone#dmclone', source_node='node-a',
        dest_node='node-b', region_sectors=128, clone_sectors=2097152,
        target_portal='10.0.0.1:3260',
        target_iqn='iqn.2010-10.org.openstack:%s' % lv, secret='ab' * 16)


def case(name, state, facts, action):
    """One row of the table; ``name`` says what happened and why."""
    return {'name': name, 'state': state, 'facts': facts, 'action': action}


# -- on the source -----------------------------------------------------------
#
# The record still names this node: the move never completed (a crash
# before the volume record was pointed at the destination, or a give-up
# that could not reach the destination).  The volume is whole here: drop
# the export, ask the destination to remove its side, forget the move.
SOURCE_CASES = [
    case('source crashed while preparing', move.PREPARING,
         F(source_here=True, dest_here=False), A(recovery.ABANDON)),
    case('source crashed after the destination answered', move.CLONED,
         F(source_here=True, dest_here=False, on_source=1, on_dest=1),
         A(recovery.ABANDON)),
    # A committed move whose volume record could not be pointed at the
    # destination: the destination's clone holds the instance's writes;
    # it repoints the record when it finalizes.
    case('crash between the commit and the volume record', move.HYDRATING,
         F(source_here=True, dest_here=False), A(recovery.LEAVE_TO_DEST)),
    case('committed, finalizing, record not repointed', move.FINALIZING,
         F(source_here=True, dest_here=False), A(recovery.LEAVE_TO_DEST)),
    case('source gave up, destination was unreachable', move.ABORTED,
         F(source_here=True, dest_here=False), A(recovery.ABANDON)),
    # (The source's side comes first: it owns a move that never moved.)
    case('source here even if the names overlap', move.PREPARING,
         F(source_here=True, dest_here=True), A(recovery.ABANDON)),
]

# -- not ours ----------------------------------------------------------------
#
# Neither the source nor the destination: never touch it.
NOT_OURS_CASES = [
    case('another node\'s move: %s' % state, state,
         F(source_here=False, dest_here=False), A(recovery.NOTHING))
    for state in move.STATES
]

# -- the source of a move that moved on --------------------------------------
#
# The record names the destination, which still reads the regions it has
# not copied from here until it retires this copy: after a reboot (LIO's
# targets and the handle gone) the export is restored.
AWAY = dict(source_here=False, dest_here=False, source_away=True)
SOURCE_AWAY_CASES = [
    case('source after the move committed: %s' % state, state, F(**AWAY),
         A(recovery.REEXPORT))
    for state in (move.CLONED, move.HYDRATING, move.FINALIZING)
] + [
    case('source of a move that never moved: %s' % state, state,
         F(**AWAY), A(recovery.NOTHING))
    for state in (move.PREPARING, move.ABORTED)
] + [
    # The record names the destination, and says preparing: the move
    # was committed, then set back by a stale whole save (R14-4); the
    # destination rolls it forward and reads from here meanwhile.
    case('source of a move set back to preparing', move.PREPARING,
         F(dest_named=True, **AWAY), A(recovery.REEXPORT)),
    case('source of an aborted move naming its destination', move.ABORTED,
         F(dest_named=True, **AWAY), A(recovery.NOTHING)),
] + [
    # A lost source that comes back while an operator abandons it: its
    # copy is stale the moment the abandon began; never export it again.
    case('source of a move abandoned over it', move.SOURCE_LOST,
         F(**AWAY), A(recovery.NOTHING)),
]

# -- on the destination ------------------------------------------------------
DEST_CASES = [
    # The source gave the move up: nothing will use what was built here.
    case('aborted', move.ABORTED, F(**DEST), A(recovery.DROP_ABORTED)),
    case('aborted, clone still loaded', move.ABORTED,
         F(on_source=1, needs_rebuild=False, **DEST),
         A(recovery.DROP_ABORTED)),
    case('aborted, half built without data LV', move.ABORTED,
         F(has_data=False, **DEST), A(recovery.DROP_ABORTED)),
    # Half built: the source holds the lock and owns the record; only
    # this node's side goes (never reuse a metadata LV that may not be
    # initialised).
    case('preparing', move.PREPARING, F(**DEST), A(recovery.TEAR_DOWN)),
    case('preparing, no data LV yet', move.PREPARING,
         F(has_data=False, needs_rebuild=True, **DEST),
         A(recovery.TEAR_DOWN)),
    # The volume record names this node: the source committed the move
    # (it names the destination only then), and a stale whole save set
    # the state back (R14-4).  Never torn down: rolled forward as the
    # clone tells (Destination.roll_forward), which keeps it if the
    # clone cannot tell.
    case('preparing, record names this node: set back', move.PREPARING,
         F(dest_named=True, **DEST), A(recovery.ROLL_FORWARD)),
    case('preparing, set back, clone lost with a reboot', move.PREPARING,
         F(dest_named=True, needs_rebuild=True, **DEST),
         A(recovery.ROLL_FORWARD)),
    case('preparing, set back, no data LV', move.PREPARING,
         F(dest_named=True, has_data=False, **DEST),
         A(recovery.ROLL_FORWARD)),

    # cloned: a live migration in progress; the detach a crash may have
    # lost decides, as the attachments now tell it.
    case('cloned, both nodes attached: wait for a detach, hydration off',
         move.CLONED, F(on_source=1, on_dest=1, **DEST),
         A(recovery.REBUILD, hydrate=False, commit=False)),
    case('cloned, both attached, clone lost with a reboot', move.CLONED,
         F(on_source=1, on_dest=1, needs_rebuild=True, **DEST),
         A(recovery.REBUILD, hydrate=False, commit=False)),
    # (A commit waits for the source's word that its copy is closed: the
    # clone comes back with hydration off, the monitor commits.)
    case('cloned, source detached: the instance runs here, commit',
         move.CLONED, F(on_source=0, on_dest=1, **DEST),
         A(recovery.REBUILD, hydrate=False, commit=True)),
    case('cloned, source detached, clone lost with a reboot', move.CLONED,
         F(on_source=0, on_dest=1, needs_rebuild=True, **DEST),
         A(recovery.REBUILD, hydrate=False, commit=True)),
    # Nobody attached: the clone holds every write made here and the
    # source LV the rest; committing keeps both, a rollback would drop
    # the first.
    case('cloned, nobody attached: commit', move.CLONED,
         F(on_source=0, on_dest=0, **DEST),
         A(recovery.REBUILD, hydrate=False, commit=True)),
    # The migration failed: roll back, unless the clone took writes
    # (roll_back_unless_written then holds the move for an operator).
    case('cloned, destination detached: roll back', move.CLONED,
         F(on_source=1, on_dest=0, **DEST), A(recovery.ROLL_BACK)),
    case('cloned, destination detached, two source attachments',
         move.CLONED, F(on_source=2, on_dest=0, **DEST),
         A(recovery.ROLL_BACK)),
    case('cloned, destination detached, clone lost with a reboot',
         move.CLONED, F(on_source=1, on_dest=0, needs_rebuild=True, **DEST),
         A(recovery.ROLL_BACK)),
    # No data LV: a rollback's teardown had begun; nothing is left here
    # to keep, the rollback is finished.
    case('cloned, no data LV, source attached', move.CLONED,
         F(on_source=1, on_dest=0, has_data=False, **DEST),
         A(recovery.ROLL_BACK)),
    case('cloned, no data LV, both attached', move.CLONED,
         F(on_source=1, on_dest=1, has_data=False, **DEST),
         A(recovery.ROLL_BACK)),
    case('cloned, no data LV, nobody attached', move.CLONED,
         F(on_source=0, on_dest=0, has_data=False, **DEST),
         A(recovery.ROLL_BACK)),

    # hydrating: committed; the clone copies with hydration on.
    case('hydrating, clone still loaded (service restart)', move.HYDRATING,
         F(**DEST), A(recovery.REBUILD, hydrate=True, commit=False)),
    case('hydrating, clone lost with a reboot', move.HYDRATING,
         F(needs_rebuild=True, **DEST),
         A(recovery.REBUILD, hydrate=True, commit=False)),
    # Only a delete removes the data LV of a committed move: it was cut
    # short; report it and touch nothing (the source keeps its copy).
    case('hydrating, data LV gone', move.HYDRATING,
         F(has_data=False, **DEST), A(recovery.REPORT_DELETED)),
    case('hydrating, data LV gone, metadata left', move.HYDRATING,
         F(has_data=False, needs_rebuild=True, **DEST),
         A(recovery.REPORT_DELETED)),

    # finalizing: fully hydrated; the swap to linear and the retire of
    # the source are run again.
    case('finalizing, clone still loaded', move.FINALIZING, F(**DEST),
         A(recovery.FINALIZE)),
    # A delete cut short after its teardown removed both LVs (only a
    # delete removes the data LV): finishing retires the source's copy,
    # which the user deleted too.
    case('finalizing, data LV and metadata gone', move.FINALIZING,
         F(has_data=False, needs_rebuild=False, **DEST),
         A(recovery.FINALIZE)),
    # After a reboot only a rebuilt clone can tell the LV is complete.
    case('finalizing, clone lost with a reboot', move.FINALIZING,
         F(needs_rebuild=True, **DEST),
         A(recovery.REBUILD, hydrate=True, finalize=True)),
    case('finalizing, data LV gone, metadata left', move.FINALIZING,
         F(has_data=False, needs_rebuild=True, **DEST),
         A(recovery.REPORT_DELETED)),

    # LVM cannot list the groups here (a PV not scanned yet after a
    # reboot; brick's lookup then reads every LV as absent): no LV is
    # known absent, so a move that reads its source is neither rolled
    # back, finalized nor rebuilt; kept, and looked at again.
] + [
    case('%s, LVM cannot list the groups here' % state, state,
         F(lvm_unlisted=True, has_data=False, on_source=s, on_dest=d,
           **DEST), A(recovery.AWAIT_LVM))
    for state in recovery.READS_SOURCE for s in (0, 1) for d in (0, 1)
] + [
    # source_lost: an operator is abandoning the lost source; only the
    # command finishes it (no rebuild over the lost source, no rollback,
    # no finalization over regions never copied).
    case('source lost, clone still loaded', move.SOURCE_LOST, F(**DEST),
         A(recovery.AWAIT_OPERATOR)),
    case('source lost, clone lost with a reboot', move.SOURCE_LOST,
         F(needs_rebuild=True, **DEST), A(recovery.AWAIT_OPERATOR)),
    case('source lost, metadata already removed', move.SOURCE_LOST,
         F(needs_rebuild=False, **DEST), A(recovery.AWAIT_OPERATOR)),
]

ALL_CASES = SOURCE_CASES + SOURCE_AWAY_CASES + NOT_OURS_CASES + DEST_CASES


@ddt.ddt
class PlanTestCase(test.TestCase):

    @ddt.data(*ALL_CASES)
    def test_plan(self, row):
        t = make_move(row['state'])
        self.assertEqual(row['action'], recovery.plan(t, row['facts']),
                         row['name'])
        # A plan is a pure function: the record is left as it was.
        self.assertEqual(make_move(row['state']), t)

    def test_every_state_is_planned_on_the_destination(self):
        planned = {row['state'] for row in DEST_CASES}
        self.assertEqual(set(move.STATES), planned)

    def test_every_action_is_planned(self):
        names = {row['action'].name
                 for row in ALL_CASES}
        self.assertEqual({recovery.NOTHING, recovery.ABANDON,
                          recovery.DROP_ABORTED, recovery.TEAR_DOWN,
                          recovery.ROLL_BACK, recovery.REBUILD,
                          recovery.FINALIZE, recovery.REPORT_DELETED,
                          recovery.REEXPORT, recovery.AWAIT_OPERATOR,
                          recovery.LEAVE_TO_DEST, recovery.ROLL_FORWARD,
                          recovery.AWAIT_LVM},
                         names)

    def test_defaults(self):
        self.assertEqual(A(recovery.NOTHING, hydrate=False, commit=False,
                           finalize=False), A(recovery.NOTHING))
        self.assertEqual(F(source_here=False, dest_here=True, on_source=0,
                           on_dest=0, has_data=True, needs_rebuild=False,
                           source_away=False, dest_named=False,
                           lvm_unlisted=False), F(**DEST))

    @ddt.data(*move.STATES)
    def test_attachments_only_matter_in_cloned(self, state):
        # Outside a live migration no detach decides anything.
        t = make_move(state)
        plans = {recovery.plan(t, F(on_source=s, on_dest=d, **DEST))
                 for s in (0, 1) for d in (0, 1)}
        self.assertEqual(1 if state != move.CLONED else 3, len(plans))


@ddt.ddt
class FactsTestCase(test.TestCase):
    """What Recovery.facts reads for plan, and what it leaves unread."""

    def setUp(self):
        super().setUp()
        self.ctxt = context.get_admin_context()
        self.clones = mock.create_autospec(clone.Clones, instance=True)
        self.clones.has_data.return_value = True
        self.clones.needs_rebuild.return_value = False
        self.clones.listed.return_value = (True, True)
        self.clones.loaded.return_value = True
        self.attachments = self.mock_object(
            recovery.attachments, 'current', return_value=[])
        self.on = self.mock_object(recovery.attachments, 'on',
                                   side_effect=[2, 1])

    def _recovery(self, node):
        """Recovery on ``node``: its two sides share its names."""
        store = mock.Mock()
        return recovery.Recovery(
            source.Source({node}, node, store, None, None, None, 'vg', None,
                          128),
            destination.Destination({node}, node, store, None, self.clones,
                                    None))

    def _volume(self, host):
        return fake_volume.fake_volume_obj(self.ctxt, id=fake.VOLUME_ID,
                                           host=host)

    def test_destination_in_cloned_counts_attachments(self):
        r = self._recovery('node-b')
        t = make_move(move.CLONED)
        volume = self._volume('node-b@dmclone#dmclone')
        self.assertEqual(F(source_here=False, dest_here=True, on_source=2,
                           on_dest=1, has_data=True, needs_rebuild=False),
                         r.facts(volume, t))
        self.attachments.assert_called_once_with(volume)
        self.assertEqual(
            [mock.call(volume, t.source_names, []),
             mock.call(volume, r.destination.node_names, [])],
            self.on.call_args_list)
        # (LVM's own listing, never brick's lookup: see below.)
        self.clones.listed.assert_called_once_with(t)
        self.clones.has_data.assert_not_called()
        self.clones.needs_rebuild.assert_not_called()

    @ddt.data(*recovery.READS_SOURCE)
    def test_what_lvm_lists_decides_for_a_move_reading_its_source(
            self, state):
        self.clones.listed.return_value = (False, True)
        self.clones.loaded.return_value = False
        self.clones.has_data.return_value = True
        facts = self._recovery('node-b').facts(
            self._volume('node-b@dmclone#dmclone'), make_move(state))
        self.assertFalse(facts.has_data)
        self.assertTrue(facts.needs_rebuild)
        self.assertFalse(facts.lvm_unlisted)

    @ddt.data(*recovery.READS_SOURCE)
    def test_a_group_lvm_cannot_list_tells_nothing(self, state):
        self.clones.listed.side_effect = dmc_exception.LVMUnlisted(
            vg='vg', reason='Volume group "vg" not found')
        self.clones.has_data.return_value = False
        facts = self._recovery('node-b').facts(
            self._volume('node-b@dmclone#dmclone'), make_move(state))
        self.assertTrue(facts.lvm_unlisted)
        self.assertEqual(A(recovery.AWAIT_LVM),
                         recovery.plan(make_move(state), facts))

    def test_destination_before_the_record_names_it(self):
        # (The source crashed before it pointed the record here.)
        facts = self._recovery('node-b').facts(
            self._volume('node-a@dmclone#dmclone'), make_move(move.CLONED))
        self.assertEqual(F(source_here=False, dest_here=True, on_source=2,
                           on_dest=1), facts)

    @ddt.data(move.HYDRATING, move.FINALIZING, move.ABORTED)
    def test_destination_outside_cloned_reads_no_attachments(self, state):
        self.clones.needs_rebuild.return_value = True
        self.clones.loaded.return_value = False
        facts = self._recovery('node-b').facts(
            self._volume('node-b@dmclone#dmclone'), make_move(state))
        self.assertEqual(F(source_here=False, dest_here=True,
                           needs_rebuild=True), facts)
        self.attachments.assert_not_called()

    def test_destination_preparing_where_the_record_names_it(self):
        # (Set back by a stale save: R14-4.)
        self.clones.needs_rebuild.return_value = True
        facts = self._recovery('node-b').facts(
            self._volume('node-b@dmclone#dmclone'),
            make_move(move.PREPARING))
        self.assertEqual(F(source_here=False, dest_here=True,
                           needs_rebuild=True, dest_named=True), facts)
        self.attachments.assert_not_called()

    def test_destination_preparing_before_the_record_names_it(self):
        facts = self._recovery('node-b').facts(
            self._volume('node-a@dmclone#dmclone'),
            make_move(move.PREPARING))
        self.assertEqual(F(source_here=False, dest_here=True), facts)

    def test_another_pool_of_the_destination_names_it(self):
        # (The pool part is the scheduler's.)
        facts = self._recovery('node-b').facts(
            self._volume('node-b@dmclone#other'), make_move(move.PREPARING))
        self.assertTrue(facts.dest_named)

    def test_another_backend_of_the_destination_does_not(self):
        facts = self._recovery('node-b').facts(
            self._volume('node-b@other#dmclone'), make_move(move.PREPARING))
        self.assertFalse(facts.dest_named)

    @ddt.data(*move.STATES)
    def test_source_where_the_record_names_it(self, state):
        facts = self._recovery('node-a').facts(
            self._volume('node-a@dmclone#dmclone'), make_move(state))
        self.assertEqual(F(source_here=True, dest_here=False,
                           has_data=False), facts)
        self.attachments.assert_not_called()
        self.clones.has_data.assert_not_called()
        self.clones.needs_rebuild.assert_not_called()

    def test_source_after_the_record_moved_on(self):
        facts = self._recovery('node-a').facts(
            self._volume('node-b@dmclone#dmclone'),
            make_move(move.HYDRATING))
        self.assertEqual(F(source_here=False, dest_here=False,
                           has_data=False, source_away=True), facts)
        self.assertEqual(A(recovery.REEXPORT),
                         recovery.plan(make_move(move.HYDRATING), facts))
        self.clones.has_data.assert_not_called()
        self.clones.needs_rebuild.assert_not_called()


@ddt.ddt
class RunTestCase(test.TestCase):
    """Recovery.run carries each planned action out on the right side."""

    def setUp(self):
        super().setUp()
        self.source = mock.create_autospec(source.Source, instance=True)
        self.dest = mock.create_autospec(destination.Destination,
                                         instance=True)
        self.dest.clones = mock.create_autospec(clone.Clones, instance=True)
        self.dest.pending_finalize = set()
        self.dest.awaiting_source = set()
        # (No mark of this node's contradicts the record: see
        # ContradictedTestCase.)
        self.dest.contradiction.return_value = None
        self.recovery = recovery.Recovery(self.source, self.dest)
        self.mock_object(recovery.Recovery, 'facts')
        self.volume = fake_volume.fake_volume_obj(
            context.get_admin_context(), id=fake.VOLUME_ID,
            provider_auth='CHAP u p')
        self.t = make_move(move.CLONED)

    def _run(self, action):
        self.mock_object(recovery, 'plan', return_value=action)
        self.assertEqual(action, self.recovery.run(self.volume, self.t))

    def _called(self):
        calls = [c for c in self.source.mock_calls + self.dest.mock_calls]
        return [c[0] for c in calls if c[0] != 'contradiction']

    def test_nothing(self):
        self._run(A(recovery.NOTHING))
        self.assertEqual([], self._called())
        self.assertEqual(set(), self.dest.pending_finalize)

    def _abandon_under_lock(self, current):
        lock = self.mock_object(move, 'lock')
        self.source.load_any.return_value = current
        self.source.lives_here.return_value = True
        self.mock_object(objects.Volume, 'get_by_id',
                         return_value=self.volume)
        self._run(A(recovery.ABANDON))
        lock.assert_called_once_with(fake.VOLUME_ID)
        lock.return_value.acquire.assert_called_once_with(blocking=True)
        lock.return_value.release.assert_called_once_with()

    def test_abandon(self):
        self._abandon_under_lock(self.t)
        self.source.abandon.assert_called_once_with(self.volume, self.t)

    @ddt.data(move.HYDRATING, move.FINALIZING)
    def test_no_abandon_once_committed_under_the_lock(self, state):
        # (Read again under the lock: the move committed meanwhile.)
        self._abandon_under_lock(make_move(state))
        self.source.abandon.assert_not_called()

    def test_abandon_waits_for_a_lock_service_that_is_down(self):
        lock = self.mock_object(move, 'lock')
        lock.return_value.acquire.side_effect = Exception('etcd down')
        self._run(A(recovery.ABANDON))
        self.source.abandon.assert_not_called()
        self.assertEqual({fake.VOLUME_ID: self.t},
                         self.recovery.pending_abandon)

    def test_leave_to_destination(self):
        self._run(A(recovery.LEAVE_TO_DEST))
        self.assertEqual([], self._called())

    def test_reexport(self):
        self._run(A(recovery.REEXPORT))
        self.source.export_again.assert_called_once_with(self.volume,
                                                         self.t)
        self.assertEqual(['export_again'], self._called())

    def test_drop_aborted(self):
        self._run(A(recovery.DROP_ABORTED))
        self.dest.drop_aborted.assert_called_once_with(self.volume, self.t)
        self.assertEqual(['drop_aborted'], self._called())

    def test_roll_back(self):
        self._run(A(recovery.ROLL_BACK))
        self.dest.roll_back_unless_written.assert_called_once_with(
            self.volume, self.t)
        self.assertEqual(['roll_back_unless_written'], self._called())

    def test_tear_down(self):
        self.dest.named_here_while_preparing.return_value = False
        self._run(A(recovery.TEAR_DOWN))
        # (Destination.tear_down: it keeps an abandoned move's old copy.)
        self.dest.tear_down.assert_called_once_with(self.volume, self.t)
        # The record is the source's: never cleared here.
        self.assertEqual(['named_here_while_preparing', 'tear_down'],
                         self._called())

    def test_no_tear_down_of_a_volume_recorded_here(self):
        # A 'preparing' record whose volume names this node was rewound
        # (R14-4): what was built here is the volume; rolled forward, or
        # kept (roll_forward returns None and reports it).
        self.dest.named_here_while_preparing.return_value = True
        self.dest.roll_forward.return_value = None
        self._run(A(recovery.TEAR_DOWN))
        self.dest.named_here_while_preparing.assert_called_once_with(
            self.volume, self.t)
        self.dest.roll_forward.assert_called_once_with(self.volume, self.t)
        self.dest.tear_down.assert_not_called()

    def test_roll_forward_kept(self):
        # (The clone cannot tell the state: Destination reports it.)
        self.dest.roll_forward.return_value = None
        self._run(A(recovery.ROLL_FORWARD))
        self.assertEqual(['roll_forward'], self._called())

    @ddt.data((move.HYDRATING, A(recovery.REBUILD, hydrate=True)),
              (move.CLONED, A(recovery.REBUILD, commit=True)),
              (move.CLONED, A(recovery.ROLL_BACK)))
    @ddt.unpack
    def test_roll_forward_then_resume(self, state, then):
        # Rolled forward: recovery goes on as the new state says (the
        # clone a reboot took is built again).
        rolled = make_move(state)
        self.dest.roll_forward.return_value = rolled
        self.mock_object(recovery, 'plan', side_effect=[
            A(recovery.ROLL_FORWARD), then])
        self.assertEqual(A(recovery.ROLL_FORWARD),
                         self.recovery.run(self.volume, self.t))
        self.dest.roll_forward.assert_called_once_with(self.volume, self.t)
        self.recovery.facts.assert_called_with(self.volume, rolled)
        if then.name == recovery.REBUILD:
            self.dest.rebuild.assert_called_once_with(
                self.volume, rolled, then.hydrate)
        else:
            self.dest.roll_back_unless_written.assert_called_once_with(
                self.volume, rolled)
        self.dest.tear_down.assert_not_called()

    def test_finalize(self):
        self._run(A(recovery.FINALIZE))
        self.assertEqual({fake.VOLUME_ID}, self.dest.pending_finalize)
        self.assertEqual([], self._called())

    def test_report_deleted(self):
        self._run(A(recovery.REPORT_DELETED))
        self.assertEqual([], self._called())
        self.assertEqual(set(), self.dest.pending_finalize)

    @ddt.data((False, False, False), (True, True, False),
              (True, False, True), (True, False, False))
    @ddt.unpack
    def test_rebuild(self, hydrate, commit, finalize):
        self._run(A(recovery.REBUILD, hydrate=hydrate, commit=commit,
                    finalize=finalize))
        self.dest.rebuild.assert_called_once_with(self.volume, self.t,
                                                  hydrate)
        # Recovery never commits itself: the monitor does, once the
        # source confirms that its copy is closed.
        # (Nor does it mark the move as waiting for the source before the
        # source was asked: the first refusal does, and reports it.)
        self.assertEqual(['rebuild'], self._called())
        self.assertEqual(set(), self.dest.awaiting_source)
        self.assertEqual({fake.VOLUME_ID} if finalize else set(),
                         self.dest.pending_finalize)


@ddt.ddt
class PlanDeletedTestCase(test.TestCase):
    """A destination mark of a deleted volume: what a start does.

    (recovery.plan_deleted: the LVs LVM lists here, None if it cannot
    list; whether anything else names the data LV.)
    """

    @ddt.data(
        # Its clone's LVs, or what a cut-short teardown left (the data
        # LV goes first), or nothing left but the mark.
        ((True, True), None, recovery.DROP_DELETED),
        ((False, True), None, recovery.DROP_DELETED),
        ((False, False), None, recovery.DROP_DELETED),
        # No build leaves a data LV alone: an old copy perhaps.
        ((True, False), None, recovery.KEEP_OLD_COPY),
        # A live volume, record or other mark names the LV.
        ((True, True), 'volume x', recovery.KEEP_NAMED),
        ((False, True), 'volume x', recovery.KEEP_NAMED),
        ((True, False), 'volume x', recovery.KEEP_NAMED),
        # Which LVs are here is unknown.
        (None, None, recovery.AWAIT_LVM),
        (None, 'volume x', recovery.AWAIT_LVM),
    )
    @ddt.unpack
    def test_plan_deleted(self, listed, named, action):
        self.assertEqual(A(action), recovery.plan_deleted(listed, named))


class LVsOfDeletedVolumesTestCase(test.TestCase):
    """Which LVs a start reports as left by deleted volumes.

    Against Cinder's own database (its sqlite test database), so that
    the lookups are the queries Cinder runs, ``_name_id`` included.
    """

    def setUp(self):
        super().setUp()
        self.ctxt = context.get_admin_context()

    def lvs(self, *ids):
        return ['volume-%s' % vid for vid in ids]

    def test_an_lv_named_after_a_live_volumes_name_id(self):
        # After a generic migration of an in-use volume the volume with
        # id VOLUME2 keeps its LV under VOLUME's name; VOLUME itself is
        # the deleted temporary volume.  (Before: reported as an LV of a
        # deleted volume, for an operator to remove.)
        tests_utils.create_volume(self.ctxt, id=fake.VOLUME2_ID,
                                  _name_id=fake.VOLUME_ID)
        temporary = tests_utils.create_volume(self.ctxt, id=fake.VOLUME_ID)
        temporary.destroy()
        self.assertEqual({}, recovery.lvs_of_deleted_volumes(
            self.ctxt, self.lvs(fake.VOLUME_ID), []))

    def test_an_lv_of_a_deleted_volume(self):
        volume = tests_utils.create_volume(self.ctxt, id=fake.VOLUME2_ID,
                                           _name_id=fake.VOLUME_ID)
        volume.destroy()
        self.assertEqual(
            {'volume-%s' % fake.VOLUME_ID: fake.VOLUME_ID,
             'volume-%s' % fake.VOLUME3_ID: fake.VOLUME3_ID},
            recovery.lvs_of_deleted_volumes(
                self.ctxt, self.lvs(fake.VOLUME_ID, fake.VOLUME3_ID), []))

    def test_an_lv_named_after_a_live_volume(self):
        tests_utils.create_volume(self.ctxt, id=fake.VOLUME_ID)
        self.assertEqual({}, recovery.lvs_of_deleted_volumes(
            self.ctxt, self.lvs(fake.VOLUME_ID), []))

    def test_the_lv_of_a_volume_here_is_not_looked_up(self):
        here = fake_volume.fake_volume_obj(self.ctxt, id=fake.VOLUME2_ID,
                                           _name_id=fake.VOLUME_ID)
        self.assertEqual({}, recovery.lvs_of_deleted_volumes(
            self.ctxt, self.lvs(fake.VOLUME_ID), [here]))
