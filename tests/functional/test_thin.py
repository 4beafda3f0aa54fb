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

"""Thin volumes (``lvm_type = thin``) on the real kernel: the thin tier.

The session's full stack runs the thin backend beside the thick one for
this module only (:meth:`services.Stack.use_thin`: each node's volume
service restarted with ``tools/testbed/stack/thin.conf``; the backend's
VG is the node's own disk ``dmc-<node>-thin``, its pool
``dmc-<node>-thin-pool`` made by Cinder's LVM driver, 95% of 16 GiB).
Volume type ``dmclone-thin`` selects it (:func:`steps.thin_type`).

Item 1 of issue 19 (thin is first-class): the scenarios the thick
backend goes through, on thin LVs: snapshot, clone, extend and moves;
revert to a snapshot; manage and unmanage of a thin LV made by hand;
live migration, committed and rolled back; a multiattach and a
``_name_id`` volume migrated (``cinder migrate``) into node B's pool.

What a move does to a thin volume's allocation is recorded, not judged:
until a move copies only the source's data (issue 19), the destination's
thin LV ends fully allocated.  The tests assert that every byte is
right and that the LV is a thin LV of the node's pool, and put its
``data_percent`` before and after each hop in the test's output (the
log and junit.xml's properties).
"""

import datetime
import logging
import uuid

import pytest

from tests.harness import services
from tests.harness import steps
from tests.harness import testbed

pytestmark = pytest.mark.layouts('separate')

LOG = logging.getLogger('thin')
MiB = testbed.MiB
GiB = 1024 * MiB
#: what a never written MiB of a thin volume reads
ZERO = testbed.sha256(bytes(MiB))
#: a sparse pattern over a 1 GiB volume: (seed, offset, length)
SPARSE = ((121, 0, 4 * MiB), (122, 300 * MiB, MiB),
          (123, GiB - 4 * MiB, 4 * MiB))


@pytest.fixture(scope='module')
def thin_backend(stack, cloud):
    """Both nodes' volume services run the thin backend too, for the module.

    Afterwards they run the thick backend alone again, as every other
    module expects.
    """
    try:
        stack.use_thin(True)
    except BaseException:
        stack.use_thin(False)
        raise
    try:
        yield services.THIN_BACKEND
    finally:
        stack.use_thin(False)


def thin_pool_name(topo, node):
    return '%s-pool' % topo.node(node).thin_vg


def thin_lv(cloud, node, volume_id, name_id=None):
    """The LVM report of the volume's LV on ``node``: a thin LV of its pool.

    ``name_id``: the volume's ``_name_id``, which names its LV.
    """
    topo = cloud.topo
    vg = topo.node(node).thin_vg
    report = testbed.lv_report(vg, node=node)
    lv = report.get('volume-%s' % (name_id or volume_id))
    assert lv is not None, ('no LV of volume %s in VG %s of node %s: %s'
                            % (volume_id, vg, node.upper(), report))
    assert (lv['segtype'], lv['pool_lv']) == (
        'thin', thin_pool_name(topo, node)), lv
    return lv


def record_allocation(record_property, what, node, lv):
    """Put a thin LV's allocation in the test's output (log, junit.xml)."""
    LOG.info('thin allocation %s: node %s, %s of %.2f GiB mapped (%s)',
             what, node.upper(), lv['data_percent'] + '%',
             int(lv['lv_size']) / GiB, lv)
    record_property('thin_data_percent_%s' % what, lv['data_percent'])
    return float(lv['data_percent'])


def report_time(caps):
    """When the scheduler received the pool's capabilities (a datetime).

    The earliest time when there is no report.
    """
    stamp = (caps or {}).get('timestamp')
    return (datetime.datetime.fromisoformat(stamp) if stamp
            else datetime.datetime.min)


def thin_pool_caps(stack, node):
    """The scheduler's capabilities of ``node``'s thin pool, or None."""
    prefix = '%s@%s#' % (stack.topo.node(node).name, services.THIN_BACKEND)
    pools = [p for p in stack.pools() if p['name'].startswith(prefix)]
    return pools[0]['capabilities'] if pools else None


@pytest.mark.extended
def test_thin_pools_reported_to_the_scheduler(cloud, stack, topo,
                                              thin_backend):
    """get-pools shows each node's thin pool as LVM has it, moves counted.

    Idle: Cinder's thin figures, the pool's size as LVM reports it and
    nothing pending.  While a slowly hydrating move into node B is under
    way, node B's pool reports what the clone will still write
    (``dmclone_hydration_pending_gb``) and takes it off its free
    capacity; once finalized, nothing is pending again.
    """
    before = {}
    for node in ('a', 'b'):
        caps = thin_pool_caps(stack, node)
        assert caps is not None, ('no thin pool of node %s in get-pools: %s'
                                  % (node.upper(), stack.pools()))
        LOG.info('node %s thin pool capabilities: %s', node.upper(), caps)
        assert (caps['thin_provisioning_support'],
                caps['thick_provisioning_support']) == (True, False), caps
        assert caps['max_over_subscription_ratio'], caps
        assert caps['dmclone_hydration_pending_gb'] == 0, caps
        vg = topo.node(node).thin_vg
        pool = testbed.lv_report(vg, node=node)[thin_pool_name(topo, node)]
        assert pool['segtype'] == 'thin-pool', pool
        assert abs(float(caps['total_capacity_gb'])
                   - int(pool['lv_size']) / GiB) < 0.1, (caps, pool)
        assert 0 < float(caps['free_capacity_gb']) <= float(
            caps['total_capacity_gb']), caps
        before[node] = caps

    vol = cloud.create(size=2, az='az-a',
                       volume_type=steps.thin_type(cloud, slow=True).id)
    try:
        att = steps.attached_on(cloud, vol.id, 'a')
        image = steps.Image([ZERO] * (2 * GiB // MiB))
        image.write(cloud, att, 131, 0, 8 * MiB)
        cloud.detach(att)
        att = steps.attached_on(cloud, vol.id, 'b')
        seen = []

        def pending_reported():
            caps = thin_pool_caps(stack, 'b') or {}
            seen.append({k: caps.get(k) for k in (
                'free_capacity_gb', 'provisioned_capacity_gb',
                'dmclone_hydration_pending_gb',
                'dmclone_transfers_in_flight')})
            if caps.get('dmclone_hydration_pending_gb'):
                return caps
            assert cloud.transfer_state(vol.id), (
                'the move finalized before a stats report showed it '
                'pending: %s' % seen)
            return None
        # (the volume services report their stats once a minute)
        caps = testbed.wait_until(
            pending_reported, 600, 'node B reporting the move pending',
            interval=5, diagnostics=lambda: 'reports seen: %s' % seen[-5:])
        LOG.info('node B thin pool during the move: %s', seen[-1])
        pending = float(caps['dmclone_hydration_pending_gb'])
        assert 0 < pending <= 2, caps
        # what the clone wrote and what it will still write: its 2 GiB
        assert float(caps['free_capacity_gb']) <= float(
            before['b']['free_capacity_gb']) - 2 + 0.1, (caps, before['b'])
        assert float(caps['provisioned_capacity_gb']) >= float(
            before['b']['provisioned_capacity_gb']) + 2, (caps, before['b'])

        # the default (fast) hydration for the rest
        cloud.retype(vol.id, steps.thin_type(cloud).name)
        steps.wait_finalized(cloud, vol.id, timeout=1800)
        # A report received until now may be older than the finalization
        # (in run 20261126-130431-17648 the first poll already read 0: a
        # report from the end of the copy, with the move still recorded,
        # would read so too).  Nothing pending must be what a report made
        # after the finalization says: one received later than this one.
        last = report_time(thin_pool_caps(stack, 'b'))
        image.check(cloud, att)
        thin_lv(cloud, 'b', vol.id)

        def reported_after_the_move():
            caps = thin_pool_caps(stack, 'b') or {}
            return (report_time(caps) > last
                    and caps.get('dmclone_hydration_pending_gb') == 0)
        testbed.wait_until(
            reported_after_the_move, 600,
            'node B reporting nothing pending after the move',
            interval=5, diagnostics=lambda: 'capabilities: %s (last report '
            'before: %s)' % (thin_pool_caps(stack, 'b'), last))
        cloud.detach(att)
    finally:
        cloud.delete(vol.id)


@pytest.mark.extended
def test_thin_volume_snapshot_clone_extend_moves_there_and_back(
        cloud, topo, thin_backend, record_property):
    """A thin clone of a snapshot, extended, moves to B and back.

    A 1 GiB thin volume on node A reads zeros, gets a sparse pattern; a
    snapshot of it and a volume from the snapshot (a thin LV too) read
    the same, the clone is extended to 2 GiB (zeros in the extension) and
    written in both parts.  The clone then moves to node B on attach and
    back to node A; at each hop the destination writes near the end while
    the copy runs, and after finalization every MiB of the 2 GiB is
    checked on the node that holds it, its LV is a thin LV of that
    node's pool and the old node keeps nothing.  The allocation of the
    clone's LV on each node is recorded (a move allocates it fully until
    issue 19's thin-aware transfer).
    """
    vt = steps.thin_type(cloud)
    vol = cloud.create(size=1, az='az-a', volume_type=vt.id)
    snap = clone = None
    try:
        thin_lv(cloud, 'a', vol.id)
        att = steps.attached_on(cloud, vol.id, 'a')
        image = steps.Image([ZERO] * (GiB // MiB))
        image.check(cloud, att)
        for seed, offset, length in SPARSE:
            image.write(cloud, att, seed, offset, length)
        image.check(cloud, att)
        cloud.detach(att)
        record_allocation(record_property, 'volume_on_a', 'a',
                          thin_lv(cloud, 'a', vol.id))

        snap = cloud.create_snapshot(vol.id)
        clone = cloud.create(size=1, volume_type=vt.id, snapshot_id=snap.id)
        assert cloud.node_of(clone.id) == 'a'
        thin_lv(cloud, 'a', clone.id)
        cloud.extend(clone.id, 2)
        image.digests += [ZERO] * (GiB // MiB)
        att = steps.attached_on(cloud, clone.id, 'a')
        image.check(cloud, att)
        image.write(cloud, att, 124, GiB + 512 * MiB, 2 * MiB)
        image.write(cloud, att, 125, 64 * MiB, MiB)
        image.check(cloud, att)
        cloud.detach(att)
        allocation = {'a': record_allocation(
            record_property, 'clone_on_a_before_moves', 'a',
            thin_lv(cloud, 'a', clone.id))}

        for hop, (old, new) in enumerate((('a', 'b'), ('b', 'a')), 1):
            LOG.info('hop %d: %s -> %s', hop, old.upper(), new.upper())
            att = steps.attached_on(cloud, clone.id, new)
            # read through the clone, then written near the end, where
            # the copy (front to back) has most likely not been yet
            before = steps.hydrated_fraction(cloud, att)
            assert cloud.sha256(att, GiB + 512 * MiB, 2 * MiB) == \
                testbed.sha256(testbed.pattern(124, 2 * MiB))
            image.write(cloud, att, 125 + hop, 2 * GiB - hop * 8 * MiB,
                        4 * MiB)
            # ... while the copy still ran: with it done, this was a read
            # and a write of a plain LV, the move's part of it unproven
            after = steps.hydrated_fraction(cloud, att)
            LOG.info('hop %d: read and written at %.1f%% .. %.1f%% '
                     'hydrated', hop, 100 * before, 100 * after)
            assert after < 1, ('hydration outran the scenario: the clone '
                               'was fully copied by the end of the write')
            steps.wait_finalized(cloud, clone.id, timeout=1800)
            image.check(cloud, att)
            allocation[new] = record_allocation(
                record_property, 'clone_on_%s_after_hop_%d' % (new, hop),
                new, thin_lv(cloud, new, clone.id))
            assert steps.kept_on(cloud, old, clone.id) == []
            assert steps.kept_on(cloud, new, clone.id) == [
                'LV volume-%s' % clone.id]
            cloud.detach(att)
            v = cloud.get(clone.id)
            assert (v.status, cloud.node_of(clone.id), v.size) == (
                'available', new, 2)
        LOG.info('thin allocation of the clone (percent of 2 GiB): %s '
                 '(a move allocates every region until the thin-aware '
                 'transfer of issue 19)', allocation)
    finally:
        for delete, rid in ((cloud.delete, clone and clone.id),
                            (cloud.delete_snapshot, snap and snap.id),
                            (cloud.delete, vol.id)):
            if rid:
                delete(rid)


@pytest.mark.extended
def test_move_into_a_thin_pool_too_small_is_refused(cloud, stack, topo,
                                                    thin_backend):
    """Node B's pool cannot take the volume: the attach there is refused.

    A thin volume larger than node B's whole pool lives on node A
    (over-subscribed, holding 4 MiB).  A move fills every region of the
    destination, so node B refuses with ThinPoolFull, naming its pool;
    the volume stays available and readable on node A, and node B keeps
    nothing of it.
    """
    caps = thin_pool_caps(stack, 'b')
    assert caps is not None, stack.pools()
    size = int(float(caps['total_capacity_gb'])) + 1
    vt = steps.thin_type(cloud)
    vol = cloud.create(size=size, az='az-a', volume_type=vt.id)
    try:
        att = steps.attached_on(cloud, vol.id, 'a')
        head = cloud.write(att, 141, 4 * MiB)
        cloud.detach(att)
        pool_b = '%s/%s' % (topo.b.thin_vg, thin_pool_name(topo, 'b'))

        att = cloud.c.attachments.create(vol.id, None,
                                         instance_id=str(uuid.uuid4()))
        with pytest.raises(Exception) as err:
            cloud.c.attachments.update(att['id'], cloud.connector('b'))
        refusal = str(err.value)
        LOG.info('attach on node B (thin pool too small) refused: %s',
                 refusal)
        assert 'cannot take volume' in refusal, refusal
        assert 'thin pool %s' % pool_b in refusal, refusal
        cloud.c.attachments.delete(att['id'])
        v = cloud.get(vol.id)
        assert (v.status, cloud.node_of(vol.id)) == ('available', 'a')
        assert cloud.transfer_state(vol.id) == {}
        assert steps.kept_on(cloud, 'b', vol.id) == []
        LOG.info('user messages: %s', cloud.messages(vol.id))

        att = steps.attached_on(cloud, vol.id, 'a')
        assert cloud.sha256(att, 0, 4 * MiB) == head
        cloud.detach(att)
        assert steps.kept_on(cloud, 'b', vol.id) == []
    finally:
        cloud.delete(vol.id)


@pytest.mark.extended
def test_thin_volume_reverted_to_its_snapshot_after_a_move(
        cloud, topo, thin_backend, record_property):
    """A thin volume moved to node B is reverted there to its snapshot.

    Written on node A, moved to node B on attach and finalized; its
    snapshot taken on B, then written more (over the snapshot's data
    and where it read zeros).  Reverted (the driver merges the thin
    snapshot into the volume's LV and makes the snapshot again; never
    Cinder's generic revert, whose sparse copy kept the data written
    since where the snapshot read zeros), every MiB reads as at the
    snapshot on node B's kernel, the LV is still a thin LV of node B's
    pool, node A keeps nothing, and of Cinder's backup snapshot nothing
    is left (no snapshot record but the one reverted to, no LV more in
    node B's thin VG than before the revert).  The snapshot, made again
    after the merge, still serves: a volume made from it reads as at
    the snapshot.
    """
    vt = steps.thin_type(cloud)
    vol, image = steps.seeded_on(cloud, 'a', SPARSE, vt.id)
    snap = None
    try:
        thin_lv(cloud, 'a', vol.id)
        att = steps.attached_on(cloud, vol.id, 'b')
        steps.wait_finalized(cloud, vol.id, timeout=1800)
        image.check(cloud, att)
        cloud.detach(att)
        thin_lv(cloud, 'b', vol.id)
        assert steps.kept_on(cloud, 'a', vol.id) == []

        snap = cloud.create_snapshot(vol.id)
        at_snapshot = steps.Image(image.digests)
        att = steps.attached_on(cloud, vol.id, 'b')
        image.write(cloud, att, 151, 0, 2 * MiB)
        image.write(cloud, att, 152, 512 * MiB, 4 * MiB)
        image.write(cloud, att, 153, GiB - MiB, MiB)
        image.check(cloud, att)
        cloud.detach(att)
        assert image.digests != at_snapshot.digests
        record_allocation(record_property, 'before_revert', 'b',
                          thin_lv(cloud, 'b', vol.id))
        vg_b = topo.node('b').thin_vg
        lvs_before = sorted(testbed.lv_report(vg_b, node='b'))

        cloud.c.volumes.revert_to_snapshot(vol.id, snap.id)
        # (the API marks the volume reverting before it answers)
        cloud.wait_status(vol.id, 'available', timeout=1800)
        # Cinder deletes its backup snapshot after the volume is available
        testbed.wait_until(
            lambda: [s.id for s in cloud.c.volume_snapshots.list(
                search_opts={'volume_id': vol.id})] == [snap.id], 600,
            'only the snapshot reverted to left of volume %s' % vol.id,
            interval=2, diagnostics=lambda: [
                (s.id, s.status) for s in cloud.c.volume_snapshots.list(
                    search_opts={'volume_id': vol.id})])
        testbed.wait_until(
            lambda: cloud.c.volume_snapshots.get(snap.id).status
            == 'available', 300, 'snapshot %s available' % snap.id,
            interval=2)
        v = cloud.get(vol.id)
        assert (v.status, cloud.node_of(vol.id), v.size) == (
            'available', 'b', 1)
        LOG.info('user messages of %s: %s', vol.id, cloud.messages(vol.id))

        att = steps.attached_on(cloud, vol.id, 'b')
        at_snapshot.check(cloud, att)
        cloud.detach(att)
        record_allocation(record_property, 'after_revert', 'b',
                          thin_lv(cloud, 'b', vol.id))
        assert steps.kept_on(cloud, 'a', vol.id) == []
        assert steps.kept_on(cloud, 'b', vol.id) == ['LV volume-%s' % vol.id]
        assert sorted(testbed.lv_report(vg_b, node='b')) == lvs_before

        copy = cloud.create(size=1, volume_type=vt.id, snapshot_id=snap.id)
        try:
            assert cloud.node_of(copy.id) == 'b'
            att = steps.attached_on(cloud, copy.id, 'b')
            at_snapshot.check(cloud, att)
            cloud.detach(att)
        finally:
            cloud.delete(copy.id)
    finally:
        if snap is not None:
            cloud.delete_snapshot(snap.id)
        cloud.delete(vol.id)


def manageable(cloud, node, lv_name):
    """The manage listing's entry of ``lv_name`` (``cinder manageable-list``).

    The listing of ``node``'s thin backend; None when it lists no such LV.
    """
    host = '%s@%s' % (cloud.topo.node(node).name, services.THIN_BACKEND)
    found = [e.to_dict() for e in cloud.c.volumes.list_manageable(host)
             if e.reference['source-name'] == lv_name]
    LOG.info('manageable on node %s, %s: %s', node.upper(), lv_name, found)
    assert len(found) <= 1, found
    return found[0] if found else None


@pytest.mark.extended
def test_thin_lv_managed_moved_and_unmanaged(cloud, topo, thin_backend,
                                             record_property):
    """A thin LV made by hand on node A: managed, moved to B, unmanaged.

    The LV (``lvcreate -T`` in node A's pool, 1 GiB, a sparse pattern
    written on node A's kernel) is listed safe to manage; managed into
    the thin backend through the API, it is renamed after the volume
    and listed as ``already managed`` by it, every MiB reads as written
    through an instance's attachment on node A.  It then moves to node
    B on attach (written there near its end): every MiB on node B's
    kernel, a thin LV of B's pool, node A keeps nothing.  Unmanaged, the
    volume is gone from the API, its LV stays on node B with every MiB
    and nothing else of it (no handle, target or session), and the
    listing no longer offers it as safe (named like a volume).  The
    test removes that LV.
    """
    vg_a = topo.node('a').thin_vg
    name = 'ft-legacy-%s' % uuid.uuid4().hex[:8]
    path = testbed.lv_path(vg_a, name)
    vt = steps.thin_type(cloud)
    vol_id = None
    try:
        testbed.lvm('lvcreate', '-q', '-y', '-T',
                    '%s/%s' % (vg_a, thin_pool_name(topo, 'a')),
                    '-V', '1g', '-n', name, node='a')
        testbed.wait_until(lambda: testbed.path_exists(path, 'a'), 30,
                           'device node %s on node A' % path)
        lv = testbed.lv_report(vg_a, node='a')[name]
        assert (lv['segtype'], lv['pool_lv'], int(lv['lv_size'])) == (
            'thin', thin_pool_name(topo, 'a'), GiB), lv
        image = steps.Image([ZERO] * (GiB // MiB))
        for seed, offset, length in SPARSE:
            cloud.on_node('a', testbed.write_pattern_digest, path, seed + 40,
                          length, offset)
            image.record(seed + 40, offset, length)
        image.check_device(cloud, 'a', path)
        entry = manageable(cloud, 'a', name)
        assert entry is not None, 'LV %s not listed on node A' % name
        assert (entry['safe_to_manage'], entry['cinder_id'],
                entry['size']) == (True, None, 1), entry

        vol = cloud.c.volumes.manage(
            cloud.pool_name('a', services.THIN_BACKEND),
            {'source-name': name}, name='ft-managed-%s' % name,
            volume_type=vt.name)
        vol_id = vol.id
        cloud.wait_status(vol_id, 'available')
        v = cloud.get(vol_id)
        assert (cloud.node_of(vol_id), v.availability_zone, v.size,
                v.volume_type) == ('a', 'az-a', 1, vt.name), (
                    cloud.host_of(v), v.availability_zone, v.size,
                    v.volume_type)
        thin_lv(cloud, 'a', vol_id)
        assert name not in testbed.lv_report(vg_a, node='a')
        assert manageable(cloud, 'a', name) is None
        entry = manageable(cloud, 'a', 'volume-%s' % vol_id)
        assert entry is not None, 'LV of %s not listed on node A' % vol_id
        assert (entry['safe_to_manage'], entry['reason_not_safe'],
                entry['cinder_id']) == (False, 'already managed',
                                        vol_id), entry
        att = steps.attached_on(cloud, vol_id, 'a')
        image.check(cloud, att)
        cloud.detach(att)
        assert steps.kept_on(cloud, 'b', vol_id) == []

        att = steps.attached_on(cloud, vol_id, 'b')
        image.write(cloud, att, 165, GiB - 16 * MiB, 4 * MiB)
        steps.wait_finalized(cloud, vol_id, timeout=1800)
        image.check(cloud, att)
        cloud.detach(att)
        record_allocation(record_property, 'managed_on_b', 'b',
                          thin_lv(cloud, 'b', vol_id))
        assert steps.kept_on(cloud, 'a', vol_id) == []
        assert steps.kept_on(cloud, 'b', vol_id) == ['LV volume-%s' % vol_id]
        entry = manageable(cloud, 'b', 'volume-%s' % vol_id)
        assert entry is not None and entry['cinder_id'] == vol_id, entry

        cloud.c.volumes.unmanage(vol_id)
        cloud.wait_gone(vol_id, what='unmanaged')
        thin_lv(cloud, 'b', vol_id)
        assert steps.kept_on(cloud, 'b', vol_id) == ['LV volume-%s' % vol_id]
        assert steps.kept_on(cloud, 'a', vol_id) == []
        image.check_device(cloud, 'b', testbed.lv_path(
            topo.node('b').thin_vg, 'volume-%s' % vol_id))
        entry = manageable(cloud, 'b', 'volume-%s' % vol_id)
        assert entry is not None, 'unmanaged LV not listed on node B'
        assert (entry['safe_to_manage'], entry['cinder_id']) == (
            False, None), entry
        assert entry['reason_not_safe'].startswith(
            'named like another volume'), entry
    finally:
        if vol_id is not None and vol_id in [
                v.id for v in cloud.c.volumes.list()]:
            cloud.delete(vol_id)
        testbed.remove_lv(vg_a, name, node='a')
        if vol_id is not None:
            for node in ('a', 'b'):
                testbed.remove_lv(topo.node(node).thin_vg,
                                  'volume-%s' % vol_id, node=node)


@pytest.mark.extended
def test_thin_volume_live_migration_there_and_back_and_a_rollback(
        cloud, thin_backend, record_property):
    """test_moves.py's live migrations, of a thin volume.

    A to B committed, B to A committed, A to B rolled back
    (:func:`steps.live_migrations`: every MiB on the kernel of the node
    that holds the volume after each, the other keeping nothing); the
    volume reads zeros before, and its LV is a thin LV of the holding
    node's pool after each (allocation recorded).
    """
    vol = cloud.create(size=1, az='az-a',
                       volume_type=steps.thin_type(cloud).id)
    step = []

    def thin_there(node):
        step.append(node)
        record_allocation(record_property, 'live_migration_%d_on_%s' % (
            len(step), node), node, thin_lv(cloud, node, vol.id))
    try:
        thin_lv(cloud, 'a', vol.id)
        steps.live_migrations(cloud, vol.id, steps.Image(
            [ZERO] * (GiB // MiB)), holder_check=thin_there)
        assert step == ['b', 'a', 'a'], step
    finally:
        cloud.delete(vol.id)


@pytest.mark.extended
def test_thin_multiattach_and_name_id_volumes_migrated_to_b(
        cloud, thin_backend):
    """``cinder migrate`` takes a multiattach and a ``_name_id`` thin volume.

    As test_drain.py's drain, into node B's thin pool: each volume is
    migrated in turn and must be on B at once; once finalized, each is
    available on B with every MiB read on B's kernel, its LV (named
    after the ``_name_id`` for that one) a thin LV of B's pool, and node
    A keeps nothing of either.
    """
    vols = []
    try:
        multi, image = steps.seeded_on(
            cloud, 'a', [(171, 0, 16 * MiB), (172, GiB - 8 * MiB, 8 * MiB)],
            steps.thin_type(cloud, multiattach=True).id)
        assert cloud.get(multi.id).multiattach
        vols.append((multi, image, None, 'multiattach'))
        renamed, image, name_id = steps.name_id_volume_on(
            cloud, 'a', [(181, 0, 16 * MiB), (182, 600 * MiB, 8 * MiB)],
            volume_type=steps.thin_type(cloud).id)
        vols.append((renamed, image, name_id, '_name_id'))
        for vol, _image, name_id, _kind in vols:
            thin_lv(cloud, 'a', vol.id, name_id)

        for vol, _image, name_id, kind in vols:
            LOG.info('cinder migrate %s (%s) to node B\'s thin pool',
                     vol.id, kind)
            assert cloud.migrate(vol.id, 'b', backend=services.THIN_BACKEND
                                 ) == 'success', (kind,
                                                  cloud.messages(vol.id))
            v = cloud.get(vol.id)
            assert (cloud.node_of(vol.id), v.status) == (
                'b', 'available'), (cloud.host_of(v), v.status)
        for vol, *_ in vols:
            steps.wait_finalized(cloud, vol.id)
        for vol, image, name_id, kind in vols:
            LOG.info('checking the %s volume %s on node B', kind, vol.id)
            steps.check_finalized_on(cloud, vol, image, 'b', 'a', name_id)
            thin_lv(cloud, 'b', vol.id, name_id)
    finally:
        for vol, *_ in vols:
            cloud.delete(vol.id)
