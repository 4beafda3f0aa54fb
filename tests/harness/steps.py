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

"""Scenario steps over the full Cinder stack, shared by the suites.

What the tests of :class:`api.Cloud` (the functional suite's full-stack
and separate-kernel scenarios, the load test) do again and again: attach
a volume the way Nova does and check where it lives, know what every MiB
of it must read (:class:`Image`), wait until a move is finalized, list
what a node keeps of a volume, and a volume type that hydrates at the
kernel's slowest pace.  Testbed guest only.
"""

import logging

from tests.harness import api
from tests.harness import services
from tests.harness import testbed

LOG = logging.getLogger('steps')
MiB = testbed.MiB
GiB = 1024 * MiB
BLOCK = MiB


class Image(object):
    """What the volume must read, block by block (sha256 per MiB)."""

    def __init__(self, digests):
        self.digests = list(digests)

    def write(self, cloud, att, seed, offset, length):
        cloud.write(att, seed, length, offset)
        self.record(seed, offset, length)

    def record(self, seed, offset, length):
        """``pattern(seed, length)`` was written at ``offset``."""
        data = testbed.pattern(seed, length)
        for i in range(0, length, BLOCK):
            self.digests[(offset + i) // BLOCK] = testbed.sha256(
                data[i:i + BLOCK])

    def check(self, cloud, att):
        self.check_device(cloud, att.node, att.path)

    def check_device(self, cloud, node, path):
        """Every block of device ``path``, read on ``node``'s kernel."""
        seen = cloud.on_node(node, api.block_digests, path,
                             len(self.digests) * BLOCK, BLOCK)
        wrong = [i for i, (a, b) in enumerate(zip(seen, self.digests))
                 if a != b]
        assert not wrong, ('%d MiB blocks of %s differ on node %s, first: %s'
                           % (len(wrong), path, node.upper(), wrong[:10]))


def kept_on(cloud, node, volume_id, name_id=None):
    """What ``node`` holds of the volume: LVs, LIO targets, iSCSI sessions.

    ``name_id``: the volume's ``_name_id`` (see :func:`name_id_volume_on`),
    after which its LV and its targets are named: matched too.
    """
    ids = [i for i in (volume_id, name_id) if i]
    lvs = testbed.lvm('lvs', '--noheadings', '-o', 'lv_name', node=node
                      ).stdout.split()
    kept = ['LV %s' % lv for lv in lvs if any(i in lv for i in ids)]
    kept += ['LIO target %s' % t for t in cloud.on_node(
        node, testbed.lio_targets) if any(i in t for i in ids)]
    kept += ['iSCSI session to %s' % t for t in cloud.on_node(
        node, testbed.iscsi_sessions).values()]
    return sorted(kept)


def attached_on(cloud, volume_id, node):
    """Nova's attach on ``node``: a local connection, the volume in use."""
    att = cloud.attach(volume_id, node)
    assert att.connection_info['driver_volume_type'] == 'local', (
        att.connection_info)
    v = cloud.get(volume_id)
    assert (v.status, cloud.node_of(volume_id)) == ('in-use', node)
    return att


def slow_hydration_type(cloud):
    """A type of this backend whose volumes hydrate at the kernel's pace.

    One region at a time (dm-clone's defaults), so that a move of 1 GiB
    is still hydrating when the test acts on it.
    """
    name = 'dmclone-slow'
    types = [t for t in cloud.c.volume_types.list() if t.name == name]
    vt = types[0] if types else cloud.c.volume_types.create(name)
    vt.set_keys({'volume_backend_name': 'dmclone',
                 'dmclone:hydration_threshold': '1',
                 'dmclone:hydration_batch_size': '1',
                 'RESKEY:availability_zones': api.HOME_AZS})
    return vt


def thin_type(cloud, slow=False, multiattach=False):
    """A type of the thin backend, placed like the default type.

    The backend runs only while :meth:`services.Stack.use_thin` is on.
    ``slow``: its volumes hydrate one region at a time, as
    :func:`slow_hydration_type`'s.  ``multiattach``: a multiattach type,
    as :meth:`api.Cloud.ensure_multiattach_type`'s.
    """
    name = 'dmclone-thin' + ('-slow' if slow else '') + (
        '-multiattach' if multiattach else '')
    types = [t for t in cloud.c.volume_types.list() if t.name == name]
    vt = types[0] if types else cloud.c.volume_types.create(name)
    specs = {'volume_backend_name': services.THIN_BACKEND,
             'RESKEY:availability_zones': api.HOME_AZS}
    if slow:
        specs.update({'dmclone:hydration_threshold': '1',
                      'dmclone:hydration_batch_size': '1'})
    if multiattach:
        specs['multiattach'] = '<is> True'
    vt.set_keys(specs)
    return vt


def hydrated_fraction(cloud, att):
    """Hydrated regions / regions of the clone under ``att``, on its node."""
    done, total = cloud.on_node(att.node, testbed.clone_progress,
                                att.path.rsplit('/', 1)[-1])
    return done / total


def power_off(stack, cloud, node):
    """``node`` loses power: its guest, its volume service, its worker."""
    stack.power_off(node)
    cloud.forget_node(node)


def seeded_on(cloud, node, writes=(), volume_type=None, fill=None):
    """A new 1 GiB volume of ``node``'s zone with known data, detached.

    Attached on ``node`` (a local connection) for the writes, then
    detached: ``writes`` are (seed, offset, length) patterns, recorded
    in the :class:`Image` returned with the volume, ``(volume, image)``.
    With ``fill``, ``fill(att)`` writes instead and its result comes
    back in place of the Image.  The volume is deleted if this fails.
    """
    vol = cloud.create(size=1, az=services.NODE_AZ[node],
                       volume_type=volume_type)
    try:
        att = attached_on(cloud, vol.id, node)
        if fill is not None:
            content = fill(att)
        else:
            content = Image(cloud.on_node(node, api.block_digests, att.path,
                                          GiB, BLOCK))
            for seed, offset, length in writes:
                content.write(cloud, att, seed, offset, length)
        cloud.detach(att)
    except BaseException:
        cloud.delete(vol.id)
        raise
    return vol, content


def name_id_volume_on(cloud, node, writes=(), volume_type=None):
    """A volume of ``node`` whose LV is named after its ``_name_id``.

    As Cinder's generic migration of an in-use volume leaves it: a
    temporary volume receives the copy (Nova's volume swap writes it),
    then the manager's ``finish_volume_migration`` swaps the two records
    (the volume keeps its id, with the temporary's ``_name_id``, so its
    LV is the temporary's) and deletes the temporary record, whose name
    is now the old LV's, so the old LV goes with it.  The testbed runs
    no Nova, so that swap cannot be asked for: here both volumes are
    made on ``node`` through the API, ``writes`` (as for
    :func:`seeded_on`) go into the temporary one, the swap is the same
    update of the two rows' ``_name_id`` the manager makes, and the
    delete of the temporary record is Cinder's own (API and driver).
    Both volumes are of ``volume_type`` (None: the default type).
    Returns ``(volume, image, name_id)``, the volume detached.
    """
    temp, image = seeded_on(cloud, node, writes, volume_type)
    try:
        vol = cloud.create(size=1, az=services.NODE_AZ[node],
                           volume_type=volume_type)
    except BaseException:
        cloud.delete(temp.id)
        raise
    try:
        cloud.stack._db(
            "UPDATE volumes SET _name_id = CASE id WHEN '%(v)s' THEN "
            "'%(t)s' ELSE '%(v)s' END WHERE id IN ('%(v)s', '%(t)s')"
            % {'v': vol.id, 't': temp.id})
        assert (cloud.name_id(vol.id), cloud.name_id(temp.id)) == (
            temp.id, vol.id)
        # (the temporary's LV is now the volume's old one: deleted)
        cloud.delete(temp.id)
        kept = kept_on(cloud, node, vol.id, temp.id)
        assert kept == ['LV volume-%s' % temp.id], kept
    except BaseException:
        cloud.delete(vol.id)
        if temp.id in [v.id for v in cloud.c.volumes.list()]:
            cloud.delete(temp.id)
        raise
    LOG.info('volume %s on node %s has _name_id %s', vol.id, node.upper(),
             temp.id)
    return vol, image, temp.id


def volume_rows(cloud):
    """How many volume records Cinder ever made, deleted ones too.

    (Cinder deletes a volume's record softly: the row stays.)  A
    migration Cinder did itself (its generic copy, after a driver that
    declined) makes a volume record for the copy; one that was refused
    makes none.  The copy's LV and targets are named after its own id,
    so what a node keeps of the migrated volume (:func:`kept_on`) never
    shows it.
    """
    return int(cloud.stack._db('SELECT COUNT(*) FROM volumes'))


def newest_volume_rows(cloud, n=3):
    """The last volume records made (id, host, status, migration_status)."""
    return cloud.stack._db(
        'SELECT id, host, status, migration_status, deleted FROM volumes '
        'ORDER BY created_at DESC LIMIT %d' % n)


def vg_free_bytes(node, vg):
    """The free bytes of volume group ``vg``, read on ``node``'s kernel."""
    return int(testbed.lvm('vgs', '--noheadings', '--units', 'b',
                           '--nosuffix', '-o', 'vg_free', vg,
                           node=node).stdout.strip())


def filled(cloud, node):
    """A volume that leaves ``node``'s volume group less than 1 GiB free.

    Sized from the group itself, once the node's pool stats (what the
    scheduler places by) agree with it.  The caller deletes it.
    """
    vg = cloud.topo.node(node).vg
    prefix = cloud.topo.node(node).name + '@'
    last = []

    def stats_current():
        free = vg_free_bytes(node, vg) / GiB
        pools = [p for p in cloud.stack.pools()
                 if p['name'].startswith(prefix)]
        reported = float(pools[0]['capabilities']['free_capacity_gb']) \
            if pools else None
        last[:] = [free, reported]
        return reported is not None and abs(reported - free) < 0.5 and free
    free = testbed.wait_until(
        stats_current, 300, 'node %s\'s pool stats current' % node.upper(),
        interval=5, diagnostics=lambda: '(VG free GiB, reported): %s' % last)
    size = int(free)
    assert size >= 1, 'node %s has %.2f GiB free only' % (node.upper(), free)
    filler = cloud.create(size=size, az=services.NODE_AZ[node])
    left = vg_free_bytes(node, vg)
    LOG.info('filler %s of %d GiB leaves node %s %d bytes', filler.id, size,
             node.upper(), left)
    assert left < GiB, left
    return filler


def still_hydrating(cloud, att, when):
    """The fraction of the clone under ``att`` copied so far: under half.

    For a scenario that acts on a move while it hydrates (a volume of
    :func:`slow_hydration_type`, copied front to back): it fails when
    the copy has outrun the scenario, ``when`` (e.g. "before the
    restart") it acts.
    """
    before = hydrated_fraction(cloud, att)
    assert before < 0.5, ('hydration outran the scenario: %.0f%% copied %s'
                          % (100 * before, when))
    return before


def wait_finalized(cloud, volume_id, timeout=900):
    """Until the transfer state is gone from the volume's record."""
    last = {}

    def done():
        state = cloud.transfer_state(volume_id)
        if state.get('dmclone_percent') != last.get('dmclone_percent'):
            LOG.info('transfer of %s: %s', volume_id, state)
        last.clear()
        last.update(state)
        return not state
    testbed.wait_until(done, timeout, 'transfer of %s finalized' % volume_id,
                       interval=2,
                       diagnostics=lambda: 'last state %s' % last)


def wait_kept_nothing(cloud, node, volume_id, name_id=None):
    """Until ``node`` keeps nothing of the volume (:func:`kept_on`).

    (An old copy may be wiped and removed in the background: see
    cinder_dmclone/wiper.py.)
    """
    testbed.wait_until(
        lambda: kept_on(cloud, node, volume_id, name_id) == [], 300,
        'node %s keeping nothing of %s' % (node.upper(), volume_id),
        interval=5, diagnostics=lambda: kept_on(cloud, node, volume_id,
                                                name_id))


def check_finalized_on(cloud, vol, image, node, old, name_id=None):
    """A detached volume moved from ``old`` finalized on ``node``.

    Available there (its zone), its ``_name_id`` still ``name_id``,
    ``old`` keeping nothing of it, ``node`` only its LV, named as before
    the move; then every MiB of ``image`` read on ``node``'s kernel
    through the attachment an instance there would have, a linear
    handle.  Detached again.
    """
    wait_finalized(cloud, vol.id)
    v = cloud.get(vol.id)
    assert (v.status, cloud.node_of(vol.id), v.availability_zone) == (
        'available', node, services.NODE_AZ[node]), (
            v.status, cloud.host_of(v), v.availability_zone)
    assert cloud.name_id(vol.id) == name_id
    wait_kept_nothing(cloud, old, vol.id, name_id)
    assert kept_on(cloud, node, vol.id, name_id) == [
        'LV volume-%s' % (name_id or vol.id)]
    att = attached_on(cloud, vol.id, node)
    try:
        table = cloud.on_node(node, testbed.dm_table,
                              att.path.rsplit('/', 1)[-1])
        assert ' linear ' in ' %s ' % table, table
        image.check(cloud, att)
    finally:
        cloud.detach(att)
    assert cloud.get(vol.id).status == 'available'


def live_migrations(cloud, volume_id, image=None, holder_check=None):
    """Live migration A to B committed, B to A committed, A to B failed.

    Of a detached 1 GiB volume on node A.  Nova's flow each time: the
    destination's attachment for the same instance (the volume moves,
    hydration off), the instance writes on the source until the
    switch-over, then Nova deletes the source's attachment (commit) or,
    when the migration fails, the destination's (rollback: the source
    keeps every write, the destination nothing).  After each, every MiB
    is checked on the node that holds the volume, and the other keeps
    nothing of it.

    ``image``: what the volume reads before (checked first; None: what
    it reads then).  ``holder_check(node)``: more checks of the node
    that holds the volume, after each.  Ends detached, on node A.
    """
    # att: the instance's attachment on the node where it runs
    att = attached_on(cloud, volume_id, 'a')
    if image is None:
        image = Image(cloud.on_node('a', api.block_digests, att.path, GiB,
                                    BLOCK))
    else:
        image.check(cloud, att)
    image.write(cloud, att, 71, 0, 8 * MiB)
    instance = att.instance

    for hop, (old, new) in enumerate((('a', 'b'), ('b', 'a')), 1):
        LOG.info('live migration %d: %s -> %s', hop, old.upper(),
                 new.upper())
        dest = cloud.attach(volume_id, new, instance=instance,
                            migration=True)
        assert cloud.transfer_state(volume_id)['dmclone_state'] == 'cloned'
        # the instance still runs on the old node and writes there;
        # the destination reads it through the clone (no copy yet)
        image.write(cloud, att, 71 + hop, hop * 64 * MiB, MiB)
        assert cloud.sha256(dest, hop * 64 * MiB, MiB) == testbed.sha256(
            testbed.pattern(71 + hop, MiB))
        assert cloud.sha256(dest, 0, 8 * MiB) == testbed.sha256(
            testbed.pattern(71, 8 * MiB))
        cloud.detach(att)                   # switch-over: commit
        att = dest
        wait_finalized(cloud, volume_id)
        image.check(cloud, att)
        assert kept_on(cloud, old, volume_id) == []
        assert cloud.node_of(volume_id) == new
        if holder_check:
            holder_check(new)

    LOG.info('live migration 3: A -> B, fails')
    att_b = cloud.attach(volume_id, 'b', instance=instance, migration=True)
    assert cloud.transfer_state(volume_id)['dmclone_state'] == 'cloned'
    image.write(cloud, att, 79, 300 * MiB, MiB)
    cloud.detach(att_b)                     # Nova's rollback
    assert cloud.transfer_state(volume_id) == {}
    assert (cloud.get(volume_id).status, cloud.node_of(volume_id)) == (
        'in-use', 'a')
    image.check(cloud, att)
    assert kept_on(cloud, 'b', volume_id) == []
    if holder_check:
        holder_check('a')
    cloud.detach(att)
