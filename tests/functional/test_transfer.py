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

"""Volumes moving from node A to node B on the real kernel.

Both nodes' volume services run the real driver; the pytest process plays
Cinder's API and Nova (see tests/harness/driver_cluster.py).  Every scenario
writes known data before and during the move and checks the sha256 of the
final device against the expected image; the automatic leak check then
finds nothing left on either node.  Node A's devices are read and written
on node A's kernel (``cluster.on_node``), so the module runs in both
layouts; the session's two volume services are conftest.py's ``cluster``.
It is written for both layouts and runs on separate kernels only (run
20261126-060122-26005: all 12 passed there); the one-kernel layout is
being retired, and CI has no room to run it twice.
"""

import os

import pytest

from tests.harness import driver_steps
from tests.harness import testbed
from tests.harness import volume_node

pytestmark = pytest.mark.layouts('separate')

MiB = testbed.MiB
GiB = driver_steps.GiB
REGION = driver_steps.REGION


# CI runs its successor on separate kernels:
#   test_moves.py::test_volume_moves_there_back_and_there_again
@pytest.mark.extended
def test_volume_moves_to_the_attaching_node(cluster):
    vid, image = driver_steps.seeded_volume(cluster, 10)

    attachment, info = cluster.attach(vid, 'b')
    assert info['driver_volume_type'] == 'local'
    path = info['data']['device_path']
    assert path == driver_steps.handle(vid, 'b')
    assert cluster.node_of(vid) == 'b'
    md = cluster.admin_metadata(vid)
    assert md['dmclone_state'] == 'hydrating'        # nothing left on A
    assert md['dmclone_source_node'] == 'node-a'

    # The instance writes locally at once, while hydration runs.
    image.write(path, 4 * MiB - 4096, testbed.pattern(20, 8192))
    image.write(path, 300 * REGION, testbed.pattern(21, REGION))
    expected = image.digest()
    assert testbed.sha256_of_device(path) == expected
    driver_steps.finish_on_b(cluster, vid, expected, attachment)


# Extended since 2026-11-26: CI's machine ran the CI tier at half the
# speed it was sized on (doc/source/contributor/testing.rst).
@pytest.mark.extended
def test_migrate_moves_a_detached_volume(cluster):
    """cinder migrate of a detached volume to node B's pool is a move.

    (Before: Cinder's generic copy, the volume unusable until it was
    whole on B.)  The scheduler hands the source the destination's pool
    stats; here they are B's own.
    """
    vid, image = driver_steps.seeded_volume(cluster, 45)
    dest = {'host': volume_node.volume_host('b'),
            'capabilities': cluster['b'].call(volume_node.pool_capabilities)}
    assert dest['capabilities']['dmclone_initiator'].startswith('iqn.')
    moved, update = cluster['a'].call(volume_node.call_ctxt,
                                      'migrate_volume', vid, dest)
    assert (moved, update) == (True, None)
    assert cluster.node_of(vid) == 'b'
    assert cluster.admin_metadata(vid)['dmclone_state'] == 'hydrating'
    # Usable on B at once: attached there while it hydrates.
    attachment, info = cluster.attach(vid, 'b')
    assert info['driver_volume_type'] == 'local'
    path = info['data']['device_path']
    image.write(path, 200 * REGION + 4096, testbed.pattern(46, 8192))
    driver_steps.finish_on_b(cluster, vid, image.digest(), attachment)


# CI runs its successor on separate kernels:
#   test_moves.py::test_live_migration_there_and_back_and_a_rollback
@pytest.mark.extended
def test_live_migration_commit(cluster):
    vid, image = driver_steps.seeded_volume(cluster, 30)
    att_a, info_a = cluster.attach(vid, 'a')
    assert info_a['driver_volume_type'] == 'local'

    # Live migration: the destination attaches while the source is in use.
    att_b, info_b = cluster.attach(vid, 'b')
    assert cluster.admin_metadata(vid)['dmclone_state'] == 'cloned'
    # The source instance keeps writing until the switch-over, and the
    # destination reads those writes through the clone.
    image.write(info_a['data']['device_path'], 50 * REGION,
                testbed.pattern(31, REGION))
    assert testbed.read_direct(info_b['data']['device_path'], 50 * REGION,
                               REGION) == testbed.pattern(31, REGION)
    status = testbed.dm_status(driver_steps.handle(vid, 'b').split('/')[-1])
    assert 'no_hydration' in status, status

    # Switch-over: the instance now runs on B, source detached = commit.
    cluster.detach(vid, att_a)
    assert cluster.admin_metadata(vid)['dmclone_state'] == 'hydrating'
    image.write(info_b['data']['device_path'], 60 * REGION + 512 * 8,
                testbed.pattern(32, 4096))
    driver_steps.finish_on_b(cluster, vid, image.digest(), att_b)


# Extended since 2026-11-26: CI's machine ran the CI tier at half the
# speed it was sized on (doc/source/contributor/testing.rst).
@pytest.mark.extended
def test_no_commit_while_the_source_instance_holds_the_volume(cluster):
    """An owner deletes the source's attachment mid-migration.

    (``openstack volume attachment delete`` through the API while the
    instance on node A still runs.)  Node A's handle stays open by the
    instance -- here this test's file descriptor -- besides LIO's export
    to node B.  The move must not commit: hydrating B from a copy that
    still changes, then retiring it, would lose every later write on A.
    The detach itself succeeds (Nova would not retry it); node B's
    monitor asks node A again at each tick and commits once the
    instance has let go.
    """
    vid, image = driver_steps.seeded_volume(cluster, 35)
    att_a, info_a = cluster.attach(vid, 'a')
    cluster.complete(vid, att_a)
    att_b, info_b = cluster.attach(vid, 'b')
    assert cluster.admin_metadata(vid)['dmclone_state'] == 'cloned'
    clone = driver_steps.handle(vid, 'b').split('/')[-1]
    path_a = info_a['data']['device_path']
    cluster.on_node('a', driver_steps.hold_open, path_a)
    try:
        cluster.detach(vid, att_a)
        cluster['b'].call(volume_node.tick)
        assert cluster.admin_metadata(vid)['dmclone_state'] == 'cloned'
        assert 'no_hydration' in testbed.dm_status(clone)
        # The instance on A goes on writing; B reads it through the clone.
        cluster.on_node('a', driver_steps.write_held, path_a, 70 * REGION,
                        testbed.pattern(36, REGION))
        image.writes.append((70 * REGION, testbed.pattern(36, REGION)))
        assert testbed.read_direct(info_b['data']['device_path'],
                                   70 * REGION, REGION) == \
            testbed.pattern(36, REGION)
        cluster['b'].call(volume_node.tick)
        assert cluster.admin_metadata(vid)['dmclone_state'] == 'cloned'
    finally:
        cluster.on_node('a', driver_steps.release, path_a)
    # The instance has left A: the next tick commits.
    cluster['b'].call(volume_node.tick)
    assert cluster.admin_metadata(vid)['dmclone_state'] == 'hydrating'
    cluster.complete(vid, att_b)
    driver_steps.finish_on_b(cluster, vid, image.digest(), att_b)


# CI runs its successor on separate kernels:
#   test_moves.py::test_live_migration_there_and_back_and_a_rollback
@pytest.mark.extended
def test_failed_live_migration_rolls_back(cluster):
    vid, image = driver_steps.seeded_volume(cluster, 40)
    att_a, info_a = cluster.attach(vid, 'a')
    att_b, info_b = cluster.attach(vid, 'b')
    assert cluster.node_of(vid) == 'b'
    image.write(info_a['data']['device_path'], 0,
                testbed.pattern(41, MiB))
    expected = image.digest()

    # The migration fails: Nova detaches the destination.
    cluster.detach(vid, att_b)
    assert cluster.node_of(vid) == 'a'
    assert not [k for k in cluster.admin_metadata(vid)
                if k.startswith('dmclone_')]
    assert not any('dmc--b' in n for n in testbed.dm_devices())
    assert not any(vid in n for n in testbed.list_lvs() if 'dmc-b' in n)
    assert driver_steps.nowhere(cluster, testbed.iscsi_sessions) == {
        'a': [], 'b': []}
    assert driver_steps.nowhere(cluster, testbed.lio_targets) == {
        'a': [], 'b': []}
    assert cluster.sha256(driver_steps.handle(vid, 'a')) == expected
    cluster.detach(vid, att_a)
    cluster.delete_volume(vid)


# Extended since 2026-11-26: CI's machine ran the CI tier at half the
# speed it was sized on (doc/source/contributor/testing.rst).
@pytest.mark.extended
def test_destination_restart_mid_hydration(cluster):
    """Node B's service dies and its kernel state goes, as in a reboot.

    No monitor tick runs before the crash, so the transfer is still in
    ``hydrating`` with its clone whatever the copy's progress (logged):
    recovery must rebuild the clone from the metadata LV, never map the
    partly copied LV alone.
    """
    vid, image = driver_steps.seeded_volume(cluster, 50)
    # The kernel's slowest hydration, so the "reboot" lands in the middle.
    cluster.use_type(vid, 'slow', {'dmclone:hydration_threshold': '1',
                                   'dmclone:hydration_batch_size': '1'})
    att_a, _info_a = cluster.attach(vid, 'a')
    attachment, info = cluster.attach(vid, 'b')    # clone, hydration off
    path = info['data']['device_path']
    name = path.split('/')[-1]
    image.write(path, 200 * REGION, testbed.pattern(51, 2 * REGION))
    testbed.run(['sync'])
    cluster.detach(vid, att_a)                     # commit: hydration on
    cluster.complete(vid, attachment)              # Nova's post-migration

    cluster.stop('b', kill=True)
    testbed.LOG.info('clone at the crash: %s', testbed.dm_status(name))
    testbed.run(['dmsetup', 'remove', '--force', name])
    testbed.run(['iscsiadm', '-m', 'node', '--logoutall=all'], check=False)
    assert testbed.iscsi_sessions() == {}

    cluster.start('b')       # check_for_setup_error recovers the clone
    status = testbed.dm_status(name)
    assert ' clone ' in ' %s ' % status, status
    # Then Cinder's start re-exports the in-use volume: the clone stays.
    assert cluster['b'].info['driver']['ensure_export'][vid] == 'ok'
    assert testbed.read_direct(path, 200 * REGION, 2 * REGION) == \
        testbed.pattern(51, 2 * REGION)
    # Retyping to a faster type retunes the live clone.
    cluster.use_type(vid, 'fast', {'dmclone:hydration_threshold': '64',
                                   'dmclone:hydration_batch_size': '16'},
                     retype_on='b')
    assert 'hydration_batch_size 16' in testbed.dm_status(name)
    driver_steps.finish_on_b(cluster, vid, image.digest(), attachment)


# CI runs its successor on separate kernels:
#   test_moves.py::test_source_powered_off_while_hydrating
# (a real power-off, not a cleared LIO)
@pytest.mark.extended
def test_source_reboot_mid_move(cluster, cleanup):
    """Node A reboots while node B still reads from it.

    (Separate kernels: a power-off and a boot.  One kernel: A's service
    is killed, then LIO's targets, A's handles and its LVs' activation
    go; /etc/target/saveconfig.json stays, as on a real disk.)  The move
    is in its live-migration window, hydration off, so node B reads
    every region it has not been written from node A.  The record names
    node B, so Cinder's start calls no ensure_export for the volume on
    node A: A's recovery must rebuild the handle and restore LIO's saved
    targets itself.  Node B's initiator logs in again, reads A's data,
    and the move commits and finishes.
    """
    cleanup(cluster.ensure_running)
    vid, image = driver_steps.seeded_volume(cluster, 95)
    far = testbed.pattern(97, REGION)
    image.write(driver_steps.handle(vid, 'a'), 900 * REGION, far)
    att_a, _info_a = cluster.attach(vid, 'a')
    cluster.complete(vid, att_a)
    attachment, info = cluster.attach(vid, 'b')    # clone, hydration off
    path = info['data']['device_path']
    image.write(path, 300 * REGION, testbed.pattern(96, REGION))
    iqn = cluster.admin_metadata(vid)['dmclone_target_iqn']
    assert iqn in cluster.on_node('a', testbed.lio_targets)

    cluster.reboot('a')
    cluster.start('a')
    targets = cluster.on_node('a', testbed.lio_targets)
    assert iqn in targets, targets
    status = testbed.dm_status(path.split('/')[-1])
    testbed.LOG.info('clone after the source came back: %s', status)
    assert 'no_hydration' in status, status
    # Region 900 was never copied (hydration off, not written here): the
    # read goes to node A through the restored export.
    assert testbed.read_direct(path, 900 * REGION, REGION) == far
    cluster.detach(vid, att_a)          # the migration ends: commit
    assert cluster.admin_metadata(vid)['dmclone_state'] == 'hydrating'
    cluster.complete(vid, attachment)
    driver_steps.finish_on_b(cluster, vid, image.digest(), attachment)


# Extended since 2026-11-26: CI's machine ran the CI tier at half the
# speed it was sized on (doc/source/contributor/testing.rst).
@pytest.mark.extended
def test_start_never_maps_a_partial_copy(cluster):
    """Node B reboots while a volume moves in, and its metadata LV is lost.

    (Say the disk of the metadata volume group failed.)  Recovery cannot
    rebuild the clone without the metadata, and the LV on node B holds
    only what was copied: nothing, hydration is off in ``cloned``.
    Neither the start nor a later connection may map that LV as the
    volume, linear and silently empty: Nova refreshing the instance's
    connection on node B (a hard reboot of it calls attachment_update
    again) is refused, and node A keeps the data.
    """
    from cinder.db import api as db
    from cinder import objects

    vid, image = driver_steps.seeded_volume(cluster, 90)
    att_a, _info_a = cluster.attach(vid, 'a')
    cluster.complete(vid, att_a)                   # the instance runs on A
    att_b, info_b = cluster.attach(vid, 'b')       # clone, hydration off
    assert cluster.admin_metadata(vid)['dmclone_state'] == 'cloned'
    name = info_b['data']['device_path'].split('/')[-1]

    cluster.stop('b', kill=True)
    testbed.run(['dmsetup', 'remove', '--force', name])
    testbed.run(['iscsiadm', '-m', 'node', '--logoutall=all'], check=False)
    testbed.lvm('lvremove', '-q', '-f', '%s/volume-%s-dmcmeta'
                % (testbed.topology().b.meta_vg, vid))
    cluster.start('b')
    outcome = cluster['b'].info['driver']['ensure_export']
    testbed.LOG.info('ensure_export at the start: %s', outcome)
    # The manager's attachment_update left the volume "attaching" (Nova
    # completes the new attachment after the switch-over): Cinder's start
    # re-exports in-use volumes only, and must not have mapped it.
    assert cluster.volume(vid).status == 'attaching'
    assert vid not in outcome, outcome
    assert name not in testbed.dm_devices()

    with pytest.raises(Exception, match='being hydrated by a transfer'):
        cluster.on_volume_node(vid, volume_node.attach, vid, att_b,
                               cluster.connector('b'))
    assert name not in testbed.dm_devices()
    assert cluster.sha256(driver_steps.handle(vid, 'a')) == image.digest()

    # Without its metadata the move cannot go on: the operator gives it
    # up by hand (operations.rst, recovery checklist), the volume stays
    # on node A.
    testbed.run(['iscsiadm', '-m', 'node', '--logoutall=all'], check=False)
    testbed.run(['iscsiadm', '-m', 'node', '-o', 'delete'], check=False)
    testbed.lvm('lvremove', '-q', '-f',
                driver_steps.lv(vid, 'b')[len('/dev/'):])
    ctxt = cluster.ctxt()
    for key in cluster.admin_metadata(vid):
        if key.startswith('dmclone_'):
            db.volume_admin_metadata_delete(ctxt, vid, key)
    db.volume_update(ctxt, vid, {'host': volume_node.volume_host('a'),
                                 'status': 'in-use'})
    objects.VolumeAttachment.get_by_id(ctxt, att_b).destroy()
    assert cluster.sha256(driver_steps.handle(vid, 'a')) == image.digest()
    cluster.detach(vid, att_a)
    cluster.delete_volume(vid)


# Extended since 2026-11-26: CI's machine ran the CI tier at half the
# speed it was sized on (doc/source/contributor/testing.rst).
@pytest.mark.extended
def test_extend_during_transfer(cluster):
    vid, image = driver_steps.seeded_volume(cluster, 60)
    att_a, _info_a = cluster.attach(vid, 'a')
    att_b, info_b = cluster.attach(vid, 'b')     # clone, hydration off
    path = info_b['data']['device_path']

    # Not while the live migration may still roll back: node A's LV
    # would be smaller than the volume's record afterwards.
    with pytest.raises(Exception, match='live migration is not decided'):
        cluster['b'].call(volume_node.call, 'extend_volume', vid, 2)
    assert testbed.device_size(path) == GiB

    cluster.detach(vid, att_a)                    # commit
    cluster['b'].call(volume_node.call, 'extend_volume', vid, 2)
    cluster.set_size(vid, 2)
    table = testbed.dm_table(path.split('/')[-1]).splitlines()
    assert [line.split()[2] for line in table] == ['clone', 'linear']
    assert testbed.device_size(path) == 2 * GiB
    tail = testbed.pattern(61, MiB)
    testbed.write_direct(path, 2 * GiB - MiB, tail)
    expected = image.digest()
    driver_steps.wait_finalized(cluster, vid)
    b_path = driver_steps.handle(vid, 'b')
    assert testbed.device_size(b_path) == 2 * GiB
    assert testbed.read_direct(b_path, 2 * GiB - MiB, MiB) == tail
    assert testbed.sha256_of_device(b_path, GiB) == expected
    cluster.detach(vid, att_b)
    cluster.delete_volume(vid)


# Extended since 2026-11-26: CI's machine ran the CI tier at half the
# speed it was sized on (doc/source/contributor/testing.rst).
@pytest.mark.extended
def test_refusals_during_transfer(cluster):
    vid = cluster.create_volume('a')
    att_a, _ = cluster.attach(vid, 'a')
    att_b, _ = cluster.attach(vid, 'b')
    with pytest.raises(Exception, match='moving from node-a to node-b'):
        cluster.create_snapshot(vid)
    cluster.forget_snapshots(vid)
    # Another instance attaching elsewhere while the move is in flight.
    with pytest.raises(Exception, match='moving from node-a to node-b'):
        cluster.attach(vid, 'a')
    cluster.detach(vid, att_b)                    # roll back
    assert cluster.node_of(vid) == 'a'
    cluster.detach(vid, att_a)
    cluster.delete_volume(vid)


# --------------------------------------------------------------------------
# The source's old copy after a move: volume_clear on the real kernel
# --------------------------------------------------------------------------

#: volume_clear_size of the wipe tests: Cinder clears this many MiB at the
#: start of an old copy (0 would clear all of it).
CLEAR_MB = 64
NO_DISCARDS_DIR = volume_node.RUN_DIR + '/lvm-no-discards'


def lvm_conf_without_discards():
    """The testbed's LVM configuration with ``issue_discards = 0``.

    As Debian ships it.  The testbed discards removed extents, and on its
    tmpfs-backed loop devices a discarded extent reads as zeros: that
    would hide an old copy that was never wiped.  LVM reads ``lvm.conf``
    in ``LVM_SYSTEM_DIR`` (Cinder's ``lvm_conf_file`` sets it to that
    file's directory), so the copy gets a directory of its own.  Runs on
    the node whose service uses it.
    """
    with open(testbed.topology().lvm_conf) as f:
        text = f.read()
    assert 'issue_discards = 1' in text, text
    os.makedirs(NO_DISCARDS_DIR, exist_ok=True)
    path = NO_DISCARDS_DIR + '/lvm.conf'
    with open(path, 'w') as f:
        f.write(text.replace('issue_discards = 1', 'issue_discards = 0'))
    seen = testbed.run(['lvm', 'config', 'devices/issue_discards'],
                       env={'LVM_SYSTEM_DIR': NO_DISCARDS_DIR}).stdout
    assert seen.strip() == 'issue_discards=0', seen
    return path


def nonzero_bytes(data):
    return len(data) - data.count(0)


# Both extended since 2026-11-26 ('zero' was in CI): CI's machine ran
# the CI tier at half the speed it was sized on (testing.rst).
@pytest.mark.parametrize('volume_clear', [
    pytest.param('zero', marks=pytest.mark.extended),
    pytest.param('none', marks=pytest.mark.extended)])
def test_source_copy_wiped_after_a_move(cluster, cleanup, volume_clear):
    """A new LV on the source's freed extents never reads the moved data.

    Node A runs with LVM's discards off and ``volume_clear`` as given,
    ``volume_clear_size`` 64.  A volume with known data moves to node B;
    when the move is finished node A retires its copy (renamed, wiped in
    the background, removed).  A new LV over exactly the same extents
    then reads: with ``zero``, zeros for the first 64 MiB (what Cinder's
    ``volume_clear_size`` clears; data further in stays, as with Cinder's
    LVM driver); with ``none``, the volume's data itself: why the setting
    matters, and proof that this test can see an old copy.
    """
    conf = cluster.on_node('a', lvm_conf_without_discards)
    cluster.stop('a')
    cleanup(cluster.start, 'a')
    cleanup(cluster.stop, 'a')
    # Node A's own LVM configuration: Cinder's brick runs lvremove,
    # lvrename and lvchange without its lvm_conf_file prefix, so they
    # read the node's (here: the environment's LVM_SYSTEM_DIR).
    cluster.start('a', overrides={'lvm_conf_file': conf,
                                  'volume_clear': volume_clear,
                                  'volume_clear_size': CLEAR_MB},
                  env={'LVM_SYSTEM_DIR': NO_DISCARDS_DIR})
    started = cluster['a'].info['driver']
    testbed.LOG.info('node A started with %s: LVM commands run as %s',
                     conf, started['lvm_cmd_prefix'])
    assert 'LVM_SYSTEM_DIR=' + NO_DISCARDS_DIR in started['lvm_cmd_prefix']
    assert cluster['a'].call(os.getenv, 'LVM_SYSTEM_DIR') == \
        NO_DISCARDS_DIR

    vid = cluster.create_volume('a')
    vg = testbed.topology().a.vg
    secrets = {0: testbed.pattern(95, 4 * MiB),                # cleared
               32 * MiB: testbed.pattern(96, MiB),             # cleared
               512 * MiB: testbed.pattern(97, MiB)}            # beyond
    for offset, data in secrets.items():
        cluster.write(driver_steps.handle(vid, 'a'), offset, data)
    extents = cluster.on_node('a', testbed.lv_pe_ranges, vg, 'volume-' + vid)
    testbed.LOG.info('volume-%s on %s', vid, extents)

    attachment, _info = cluster.attach(vid, 'b')          # moves to B
    driver_steps.wait_finalized(cluster, vid)

    def old_copies():
        return sorted(n for n in cluster.on_node('a', testbed.list_lvs)
                      if n.startswith(vg + '/') and vid in n)
    testbed.LOG.info('node A right after the move: %s', old_copies())
    testbed.wait_until(lambda: old_copies() == [], 600,
                       'old copy of %s wiped and removed' % vid,
                       interval=1, diagnostics=lambda: 'LVs: %s' % (
                           old_copies(),))

    name = 'ft-wipe-check-' + volume_clear
    cleanup(cluster.on_node, 'a', testbed.remove_lv, vg, name)
    path = cluster.on_node('a', testbed.create_lv_on_extents, vg, name,
                           extents)
    assert cluster.on_node('a', testbed.lv_pe_ranges, vg, name) == extents
    found = {offset: cluster.read(path, offset, len(data)) == data
             for offset, data in secrets.items()}
    head = cluster.read(path, 0, CLEAR_MB * MiB)
    testbed.LOG.info('new LV over the old extents (volume_clear=%s): %d '
                     'non-zero bytes in the first %d MiB; old data found '
                     'at %s', volume_clear, nonzero_bytes(head), CLEAR_MB,
                     sorted(o for o, hit in found.items() if hit))
    if volume_clear == 'zero':
        assert nonzero_bytes(head) == 0
        assert found == {0: False, 32 * MiB: False, 512 * MiB: True}
    else:
        assert found == {0: True, 32 * MiB: True, 512 * MiB: True}

    cluster.detach(vid, attachment)
    cluster.delete_volume(vid)
