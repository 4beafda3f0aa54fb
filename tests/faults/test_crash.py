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

"""kill -9 of a volume service at every step of a live migration's move.

The destination's service (node B) kills itself with SIGKILL right after
a step of the move's state machine (``volume_node.CRASH_POINTS``: the
prepare, commit and finalize steps of cinder_dmclone.destination and
cinder_dmclone.clone), or the
source's service dies during hydration, or node B "reboots".  Each
scenario writes known data before and during the move, restarts what
died, retries what Nova would retry (the attach, the detach), and checks
the end: the volume on node A only with the same data (a move that never
committed), or on node B only with all the writes (a committed one).
The leak check then finds nothing left on either node.

Then the teardowns, as the unit model's crash matrix has them
(tests/unit/test_two_nodes.py, CrashTestCase): node B killed at each step
of a failed live migration's rollback, of a detach that keeps a clone
which took writes, of its abort of a move the source gave up, of a
delete of a volume hydrating there; and node A killed while its wiper
clears the old copy a finished move retired.  Node B wipes its old
copies in these (``helpers.WIPING``: a data LV is renamed, then wiped
and removed in the background), so that "data LV handed to the wiper"
is the step it is on a node that honours ``volume_clear``.
"""

import time

import pytest

from tests.faults import helpers
from tests.harness import driver_steps
from tests.harness import testbed
from tests.harness import volume_node

pytestmark = pytest.mark.layouts('one-kernel', 'separate')

REGION = helpers.REGION
MiB = helpers.MiB
# The move's own steps; the teardowns' have scenarios of their own below.
POINTS = [p for p in volume_node.CRASH_POINTS
          if p.split(':')[0] in ('prepare', 'commit', 'finalize')]
ROLLBACK_POINTS = volume_node.crash_points('rollback')
HELD_POINTS = volume_node.crash_points('held')
ABORT_POINTS = volume_node.crash_points('abort')
DELETE_POINTS = volume_node.crash_points('delete')
WIPE_POINTS = volume_node.crash_points('wipe')


def _live_migration_start(cluster, seed_value):
    vid, image = driver_steps.seeded_volume(cluster, seed_value)
    att_a, info_a = cluster.attach(vid, 'a')
    return vid, image, att_a, info_a['data']['device_path']


@pytest.mark.parametrize('point', POINTS)
def test_destination_killed(cluster, fault, point):
    fault.scenario = 'kill -9 destination after %s' % point
    seed_value = 100 + 10 * POINTS.index(point)
    vid, image, att_a, path_a = _live_migration_start(cluster, seed_value)
    phase = point.split(':')[0]

    if phase == 'prepare':
        cluster['b'].call(volume_node.arm_crash, point)
        with pytest.raises(Exception):
            cluster.attach(vid, 'b')
        # The instance goes on writing on A; the move never happened.
        image.write(path_a, 7 * REGION,
                    testbed.pattern(seed_value + 5, REGION))
        helpers.restart(cluster, 'b', fault)
        helpers.stays_on_a(cluster, vid, image.digest())
        fault.detail = 'move refused, B cleaned at restart (state %s)' % (
            helpers.state(cluster, vid) or 'cleared')
        # Nova tries the live migration again: it now succeeds.
        att_b, info_b = cluster.attach(vid, 'b')
    else:
        att_b, info_b = cluster.attach(vid, 'b')
    path_b = info_b['data']['device_path']
    assert helpers.state(cluster, vid) == 'cloned'
    image.write(path_a, 9 * REGION, testbed.pattern(seed_value + 6, REGION))

    if phase == 'commit':
        cluster['b'].call(volume_node.arm_crash, point)
        with pytest.raises(Exception):
            cluster.detach(vid, att_a)
        helpers.restart(cluster, 'b', fault)
        # Nova retries the detach of the source that timed out.
        cluster.detach(vid, att_a)
        fault.detail = 'detach retried after restart'
    else:
        cluster.detach(vid, att_a)
    assert helpers.state(cluster, vid) == 'hydrating'
    image.write(path_b, 11 * REGION + 4096,
                testbed.pattern(seed_value + 7, 8192))
    # Now, while node A still has the volume's LV (the base of the
    # image): a crash after the source was retired leaves none.
    expected = image.digest()

    if phase == 'finalize':
        cluster['b'].call(volume_node.arm_crash, point)
        helpers.tick_until_dead(cluster, 'b')
        before = helpers.state(cluster, vid)
        helpers.restart(cluster, 'b', fault)
        fault.detail = 'state at the crash: %s' % (before or 'cleared')
    driver_steps.finish_on_b(cluster, vid, expected, att_b)


def test_source_killed_during_hydration(cluster, fault):
    fault.scenario = 'kill -9 source during hydration'
    vid, image, att_a, path_a = _live_migration_start(cluster, 300)
    cluster.use_type(vid, 'slow', helpers.SLOW)
    att_b, info_b = cluster.attach(vid, 'b')
    cluster.detach(vid, att_a)                        # commit
    cluster.stop('a', kill=True)
    image.write(info_b['data']['device_path'], 20 * REGION,
                testbed.pattern(301, 2 * REGION))
    # The copy goes on (LIO serves it from node A's kernel); the
    # finalization waits for node A's service to retire its copy.
    testbed.wait_until(
        lambda: cluster['b'].call(volume_node.tick) is not None
        and helpers.state(cluster, vid) == 'finalizing', 900,
        'finalization blocked on the dead source', interval=2)
    assert cluster.exists(driver_steps.lv(vid, 'a')), 'source LV gone early'
    t0 = time.monotonic()
    cluster.start('a')
    driver_steps.finish_on_b(cluster, vid, image.digest(), att_b)
    fault.recovered(t0)
    fault.detail = 'finalization waited in "finalizing" for the source'


def test_destination_reboot_during_hydration(cluster, fault):
    fault.scenario = 'reboot of the destination during hydration'
    vid, image, att_a, path_a = _live_migration_start(cluster, 310)
    cluster.use_type(vid, 'slow', helpers.SLOW)
    att_b, info_b = cluster.attach(vid, 'b')
    path_b = info_b['data']['device_path']
    image.write(path_b, 30 * REGION, testbed.pattern(311, 2 * REGION))
    cluster.detach(vid, att_a)                        # commit
    image.write(path_b, 40 * REGION + 512, testbed.pattern(312, 4096))
    testbed.run(['sync'], node='b')
    name = path_b.split('/')[-1]
    fault.detail = 'regions hydrated at the reboot: %s' % (
        cluster.on_node('b', testbed.dm_status, name).split()[6])
    helpers.reboot_b(cluster)
    t0 = time.monotonic()
    cluster.start('b')             # recovery rebuilds the clone
    fault.recovered(t0)
    assert ' clone ' in ' %s ' % cluster.on_node('b', testbed.dm_status, name)
    assert cluster.read(path_b, 30 * REGION, 2 * REGION) == \
        testbed.pattern(311, 2 * REGION)
    driver_steps.finish_on_b(cluster, vid, image.digest(), att_b)


@pytest.mark.parametrize('writes_on_source', [False, True])
def test_failed_live_migration(cluster, fault, writes_on_source):
    fault.scenario = 'failed live migration, destination detached %s ' \
        'writes on the source' % ('after' if writes_on_source else 'before')
    vid, image, att_a, path_a = _live_migration_start(
        cluster, 320 + int(writes_on_source))
    att_b, info_b = cluster.attach(vid, 'b')
    if writes_on_source:
        image.write(path_a, 0, testbed.pattern(325, 2 * helpers.MiB))
        assert cluster.read(
            info_b['data']['device_path'], 0, 2 * helpers.MiB) == \
            testbed.pattern(325, 2 * helpers.MiB)
    cluster.detach(vid, att_b)                        # rollback
    assert helpers.state(cluster, vid) is None
    helpers.end_on_a(cluster, vid, image, att_a)


# --------------------------------------------------------------------------
# Teardowns: rollback, a kept clone, abort, delete, and the source's wipe
# --------------------------------------------------------------------------

@pytest.fixture(scope='module')
def options(cluster):
    """The scenarios below set both nodes' options (helpers.with_options).

    Consecutive ones that need the same options pay no restart (hence
    their order: the testbed's options, then node B wiping, then node A);
    the services run with the testbed's own options after this module.
    """
    yield
    for key in ('a', 'b'):
        helpers.with_options(cluster, key)


def _where(cluster, volume_id):
    return 'state %s, record on %s' % (
        helpers.state(cluster, volume_id) or 'cleared',
        cluster.node_of(volume_id))


def _b_copy_wiped(volume_id, since):
    """Node B's old copy of the volume was wiped; how many times."""
    done = helpers.wipes(helpers.old_copies_prefix('b', volume_id), since)
    assert done, 'no complete wipe of node B\'s copy of %s' % volume_id
    return len(done)


@pytest.mark.parametrize('point', HELD_POINTS)
def test_destination_killed_keeping_a_written_clone(cluster, fault,
                                                    options, point):
    """The destination's detach keeps a clone that took writes.

    The live migration switched over and the instance wrote on node B,
    but node A's attachment outlived it (its compute died before cleaning
    up).  A detach on B must not roll back (it would discard those
    writes): the move is held in ``cloned``.  Node B is killed at a step
    of that detach; after the restart and Nova's retry the move is still
    held, B's clone shows every write; once the stale attachment on A is
    deleted the move commits and finishes on B with all the data.
    """
    fault.scenario = 'kill -9 destination after %s' % point
    seed_value = 560 + 10 * HELD_POINTS.index(point)
    helpers.with_options(cluster, 'a')
    helpers.with_options(cluster, 'b')
    vid, image, att_a, path_a = _live_migration_start(cluster, seed_value)
    att_b, info_b = cluster.attach(vid, 'b')
    path_b = info_b['data']['device_path']
    assert helpers.state(cluster, vid) == 'cloned'
    # Before the switch-over the instance writes on A, after it on B
    # (a sub-region write copies its region first, a whole one not).
    image.write(path_a, 9 * REGION, testbed.pattern(seed_value + 5, REGION))
    image.write(path_b, 11 * REGION + 4096,
                testbed.pattern(seed_value + 6, 8192))
    image.write(path_b, 20 * REGION, testbed.pattern(seed_value + 7, REGION))
    # Now, while node A still has the volume's LV (the image's base).
    expected = image.digest()

    cluster['b'].call(volume_node.arm_crash, point)
    with pytest.raises(Exception):
        cluster.detach(vid, att_b)
    at_crash = _where(cluster, vid)
    helpers.restart(cluster, 'b', fault)
    cluster.detach(vid, att_b)                        # Nova's retry
    md = cluster.admin_metadata(vid)
    assert md.get('dmclone_state') == 'cloned', md
    assert md.get('dmclone_stale_source_attachment') == 'node-a', md
    assert cluster.node_of(vid) == 'b'
    name = path_b.split('/')[-1]
    assert ' clone ' in ' %s ' % cluster.on_node('b', testbed.dm_status, name)
    assert cluster.sha256(path_b) == expected
    fault.detail = ('at the crash: %s; kept after the retried detach, '
                    'committed when A\'s stale attachment went' % at_crash)
    # The operator deletes the stale attachment: the move commits.
    cluster.detach(vid, att_a)
    assert helpers.state(cluster, vid) == 'hydrating'
    driver_steps.wait_finalized(cluster, vid)
    driver_steps.assert_only_on_b(cluster, vid, expected)
    cluster.delete_volume(vid)


@pytest.mark.parametrize('point', ROLLBACK_POINTS)
def test_destination_killed_in_rollback(cluster, fault, options, point):
    """A failed live migration's rollback, node B killed at a step.

    Nova detaches the destination while the instance still runs on node
    A.  At the restart, recovery either rebuilds the clone (the data LV
    is still there: the retried detach then rolls back) or finishes the
    rollback itself (the data LV is gone: nothing to keep); Nova's retry
    of the detach then reaches whichever node the record names.  The end:
    the volume on node A alone with everything written there, nothing of
    it on node B, B's copy wiped.
    """
    fault.scenario = 'kill -9 destination after %s' % point
    seed_value = 500 + 10 * ROLLBACK_POINTS.index(point)
    helpers.with_options(cluster, 'a')
    helpers.with_options(cluster, 'b', helpers.WIPING)
    since = volume_node.root_command_marks()
    vid, image, att_a, path_a = _live_migration_start(cluster, seed_value)
    att_b, _info_b = cluster.attach(vid, 'b')
    assert helpers.state(cluster, vid) == 'cloned'
    # The instance writes on node A during the migration, and never on B.
    image.write(path_a, 9 * REGION, testbed.pattern(seed_value + 5, REGION))
    image.write(path_a, 12 * REGION + 4096,
                testbed.pattern(seed_value + 6, 8192))

    cluster['b'].call(volume_node.arm_crash, point)
    with pytest.raises(Exception):
        cluster.detach(vid, att_b)                    # roll back
    at_crash = _where(cluster, vid)
    helpers.restart(cluster, 'b', fault, overrides=helpers.WIPING)
    at_restart = _where(cluster, vid)
    # Nova retries the detach of the destination that failed.
    retried_on = cluster.node_of(vid)
    cluster.detach(vid, att_b)
    assert helpers.state(cluster, vid) is None, cluster.admin_metadata(vid)
    helpers.wait_nothing_on_b(cluster, vid)
    wiped = _b_copy_wiped(vid, since)
    fault.detail = ('at the crash: %s; after the restart: %s; detach '
                    'retried on node %s; B\'s copy wiped (%d dd)' % (
                        at_crash, at_restart, retried_on.upper(), wiped))
    helpers.end_on_a(cluster, vid, image, att_a)


@pytest.mark.parametrize('point', ABORT_POINTS)
def test_destination_killed_in_abort(cluster, fault, options, point):
    """The source gives a move up; node B is killed removing its build.

    Nova withdraws the destination's attach while node B builds the clone
    (its attach call timed out): node A refuses to record the move,
    removes its export, and asks B to abort.  B dies at a step of that
    teardown, so A keeps the move as ``aborted`` (the volume usable on A,
    nothing treats it as moving).  At B's restart its recovery removes
    what is left and clears the record; the volume stays on A, intact,
    and the instance there never stopped writing.
    """
    fault.scenario = 'kill -9 destination after %s' % point
    seed_value = 700 + 10 * ABORT_POINTS.index(point)
    helpers.with_options(cluster, 'a')
    helpers.with_options(cluster, 'b', helpers.WIPING)
    since = volume_node.root_command_marks()
    vid, image, att_a, path_a = _live_migration_start(cluster, seed_value)

    cluster['b'].call(volume_node.arm_withdrawn_attach, point)
    # Nova's attach on B (cluster.attach would delete the attachment
    # afterwards; Nova already did).
    att_b = cluster.reserve(vid)
    with pytest.raises(Exception, match='deleted while the move was'):
        cluster.on_volume_node(vid, volume_node.attach, vid, att_b,
                               cluster.connector('b'))
    # (B dies before it answers A's abort, unless its logout outlasted
    # A's transfer timeout.)
    testbed.wait_until(lambda: not cluster.alive('b'), 600,
                       'node B killed in its abort')
    assert cluster.node_of(vid) == 'a'
    assert helpers.state(cluster, vid) == 'aborted', \
        cluster.admin_metadata(vid)
    image.write(path_a, 7 * REGION, testbed.pattern(seed_value + 5, REGION))
    helpers.restart(cluster, 'b', fault, overrides=helpers.WIPING)
    helpers.wait_nothing_on_b(cluster, vid)
    assert helpers.state(cluster, vid) is None, cluster.admin_metadata(vid)
    wiped = _b_copy_wiped(vid, since)
    fault.detail = ('attach withdrawn during the build; A recorded the '
                    'move aborted; B\'s recovery removed the rest (its '
                    'copy wiped, %d dd)' % wiped)
    helpers.end_on_a(cluster, vid, image, att_a)


@pytest.mark.parametrize('point', DELETE_POINTS)
def test_destination_killed_in_delete(cluster, fault, options, point):
    """A delete of a volume hydrating on node B; B killed at a step.

    The delete fails (the volume would be left in error_deleting); B
    restarts; the user deletes the volume again, which must remove
    everything on both nodes and succeed.
    """
    fault.scenario = 'kill -9 destination after %s' % point
    seed_value = 800 + 10 * DELETE_POINTS.index(point)
    helpers.with_options(cluster, 'a')
    helpers.with_options(cluster, 'b', helpers.WIPING)
    since = volume_node.root_command_marks()
    vid, image = driver_steps.seeded_volume(cluster, seed_value)
    # The kernel's slowest hydration: the copy is under way at the delete.
    cluster.use_type(vid, 'slow', helpers.SLOW)
    att_b, info_b = cluster.attach(vid, 'b')          # moves, hydrates
    image.write(info_b['data']['device_path'], 30 * REGION,
                testbed.pattern(seed_value + 5, REGION))
    cluster.detach(vid, att_b)
    assert helpers.state(cluster, vid) == 'hydrating'

    cluster['b'].call(volume_node.arm_crash, point)
    with pytest.raises(Exception):
        cluster.delete_volume(vid)
    at_crash = _where(cluster, vid)
    helpers.restart(cluster, 'b', fault, overrides=helpers.WIPING)
    cluster.delete_volume(vid)                        # deleted again
    helpers.wait_nothing_on_b(cluster, vid)
    # Each node's own kernel: these helpers name no node, so they look
    # at the kernel on_each runs them on (testbed.run's default).
    for key, lvs in cluster.on_each(testbed.list_lvs).items():
        assert not [n for n in lvs if vid in n], key
    for key, devices in cluster.on_each(testbed.dm_devices).items():
        assert not [n for n in devices if vid in n], key       # handles
    for fn in (testbed.lio_targets, testbed.iscsi_sessions):
        assert driver_steps.nowhere(cluster, fn) == {'a': [], 'b': []}
    wiped = _b_copy_wiped(vid, since)
    fault.detail = ('at the crash: %s; the second delete removed both '
                    'copies (B\'s wiped, %d dd)' % (at_crash, wiped))


@pytest.mark.parametrize('point', WIPE_POINTS)
def test_source_killed_wiping_its_old_copy(cluster, fault, options, point):
    """Node A dies while its wiper clears the copy a finished move retired.

    Node A wipes old copies (``helpers.WIPING``).  When the move to node B
    is finalized, A renames its LV and wipes it in the background; A is
    killed there, before the wipe or after it but before the LV's
    removal.  The renamed LV holds the volume's data, or zeros over what
    volume_clear_size clears.  At A's restart the wiper finds it, wipes it
    again and removes it; the move ends on B with all the data.
    """
    fault.scenario = 'kill -9 source after %s' % point
    seed_value = 900 + 10 * WIPE_POINTS.index(point)
    helpers.with_options(cluster, 'a', helpers.WIPING)
    helpers.with_options(cluster, 'b')
    vid, image = driver_steps.seeded_volume(cluster, seed_value)
    att_b, info_b = cluster.attach(vid, 'b')          # moves, hydrates
    image.write(info_b['data']['device_path'], 30 * REGION,
                testbed.pattern(seed_value + 5, REGION))
    # Now, while node A still has the volume's LV (the image's base).
    expected = image.digest()

    cluster['a'].call(volume_node.arm_crash, point)
    # Node B's monitor finalizes the move: A retires its copy.
    deadline = time.monotonic() + 900
    while cluster.alive('a'):
        assert time.monotonic() < deadline, 'node A not killed: %s' % (
            cluster.admin_metadata(vid))
        cluster['b'].call(volume_node.tick)
        time.sleep(2)
    at_crash = helpers.state(cluster, vid) or 'cleared'
    vg = testbed.topology().a.vg
    old = sorted(n for n in cluster.on_node('a', testbed.list_lvs)
                 if n.startswith(vg + '/') and vid in n)
    assert len(old) == 1 and '-dmcwipe-' in old[0], old
    path = '/dev/' + old[0]
    wipe_mb = helpers.WIPE_MB
    if point == 'wipe: old copy renamed':
        assert not helpers.wipes(path)
        assert cluster.read(path, 0, 4 * MiB) == \
            testbed.pattern(seed_value, 4 * MiB)
        found = 'the volume\'s data'
    else:
        assert len(helpers.wipes(path)) == 1
        assert cluster.read(path, 0, wipe_mb * MiB) == bytes(wipe_mb * MiB)
        # (Beyond volume_clear_size nothing is cleared, as with Cinder.)
        assert cluster.read(path, image.size // 2, MiB) == \
            testbed.pattern(seed_value + 2, MiB)
        found = 'zeros over its first %d MiB' % wipe_mb

    since = volume_node.root_command_marks()
    t0 = time.monotonic()
    helpers.restart(cluster, 'a', overrides=helpers.WIPING)
    testbed.wait_until(
        lambda: old[0] not in cluster.on_node('a', testbed.list_lvs), 300,
        '%s wiped and removed after the restart' % old[0], interval=1)
    fault.recovered(t0)
    assert helpers.wipes(path, since), 'no complete wipe of %s after the ' \
        'restart' % path
    fault.detail = ('state at the crash: %s; the renamed LV held %s; '
                    'wiped again and removed after the restart'
                    % (at_crash, found))
    driver_steps.finish_on_b(cluster, vid, expected, att_b)
