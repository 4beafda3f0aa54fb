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

"""In-memory stand-ins for the kernel, for fast unit tests.

The real kernel is exercised by the functional suite in the testbed; these
fakes keep the driver's unit tests about the driver's decisions.
"""

import copy

from oslo_concurrency import processutils

from cinder import exception as cinder_exception

from cinder_dmclone import dmsetup
from cinder_dmclone import exception


class FakeDMSetup(object):
    """Device-mapper devices as a dict, behind privileged.DMSetup's interface.

    Tables go through the real builders' validation (format_table), and the
    calls are recorded in ``calls`` for ordering assertions.
    """

    def __init__(self, sizes=None, targets=None):
        self.devices = {}
        self.uuids = {}
        self.suspended = set()
        self.sizes = dict(sizes or {})
        self.target_types = dict(targets or {'linear': 'v1.4.0',
                                             'clone': 'v1.0.0'})
        self.calls = []
        self.fail_on = {}
        #: devices that exist for tables: with ``strict``, a table naming
        #: a device outside ``sizes`` is refused, as the kernel would.
        self.strict = False
        #: called with (name, segments) before a table goes live.
        self.check_table = None
        #: called with the data device of a clone once fully hydrated.
        self.on_hydrated = None
        #: hydrated regions, kept per metadata device as dm-clone does.
        self.meta_hydrated = {}
        #: runtime hydration flag of each clone device (messages change it).
        self.hydration = {}
        #: devices whose clone reports Fail.
        self.failed = set()
        #: clones' destinations cannot discard (a thick LV over a disk
        #: without discard): every clone reports no_discard_passdown.
        self.cannot_discard = False
        #: devices whose clone reports its metadata read-only ("ro": a
        #: metadata commit failed).
        self.read_only = set()
        #: regions marked hydrated by discards, per metadata device.
        self.discarded = {}
        #: called with (name, first region, end region) of a discard.
        self.check_discard = None
        #: openers of a device (an instance's process, say): its open
        #: count, and a remove fails while any holds it, as in the kernel.
        self.openers = {}

    def _call(self, op, *args):
        self.calls.append((op,) + args)
        if op in self.fail_on:
            raise self.fail_on[op]

    def _require(self, name):
        if name not in self.devices:
            raise exception.DMDeviceNotFound(
                command='dmsetup %s' % name, exit_code=1,
                reason='Device does not exist.')

    def create(self, name, segments, uuid):
        self._call('create', name)
        dmsetup.validate_name(name)
        if name in self.devices:
            raise exception.DMSetupCommandFailed(
                command='dmsetup create %s' % name,
                reason='Device or resource busy')
        self._check(name, segments)
        self.devices[name] = list(segments)
        self.uuids[name] = uuid
        self._activated(name)

    def _check(self, name, segments):
        dmsetup.format_table(segments)
        if self.strict:
            for seg in segments:
                devs = seg.args[:3] if seg.target == 'clone' else seg.args[:1]
                for dev in devs:
                    if dev not in self.sizes:
                        raise exception.DMSetupCommandFailed(
                            command='dmsetup create %s' % name,
                            reason='%s: No such device' % dev)
        if self.check_table is not None:
            self.check_table(name, list(segments))

    def _activated(self, name):
        """A table went live: the clone's flags come from its table."""
        self.hydration.pop(name, None)
        clone = self._clone(name)
        if clone is not None:
            args = dmsetup.parse_clone_table(clone)
            self.hydration[name] = 'no_hydration' not in args.features

    def _clone(self, name):
        for seg in self.devices.get(name, []):
            if seg.target == 'clone':
                return seg
        return None

    def load(self, name, segments):
        self._call('load', name)
        self._require(name)
        self._check(name, segments)
        self._refuse_stale_clone_metadata(name, segments)
        self._inactive = (name, list(segments))

    def _refuse_stale_clone_metadata(self, name, segments):
        """The kernel's trap, made loud: a clone table built too early.

        dm-clone reads its metadata (which regions are hydrated) when a
        table is constructed, and the live table commits what it changed
        since its last commit only when it is suspended.  A new clone
        table over the same metadata loaded while the old one still runs
        starts from a stale bitmap: regions hydrated (or written) in
        between would be copied again from the source over newer data.
        """
        live = self._clone(name)
        if live is None or name in self.suspended:
            return
        meta = dmsetup.parse_clone_table(live).metadata_dev
        for seg in segments:
            if (seg.target == 'clone' and
                    dmsetup.parse_clone_table(seg).metadata_dev == meta):
                raise AssertionError(
                    'clone table of %s loaded while its live clone over '
                    'the same metadata runs: the new table would start '
                    'from uncommitted metadata' % name)

    def suspend(self, name, flush=True):
        self._call('suspend', name)
        self._require(name)
        self.suspended.add(name)

    def resume(self, name):
        self._call('resume', name)
        self._require(name)
        inactive = getattr(self, '_inactive', None)
        if inactive and inactive[0] == name:
            self.devices[name] = inactive[1]
            self._inactive = None
            self._activated(name)
        self.suspended.discard(name)

    def reload(self, name, segments):
        # as the real DMSetup.reload: resume swaps under its own suspend
        self.load(name, segments)
        self.resume(name)

    def swap(self, name, segments, check=None):
        """As the real DMSetup.swap: suspend, check, load, resume."""
        self._call('swap', name)
        self.suspend(name)
        if check is not None and not check():
            self.resume(name)
            return False
        self.load(name, segments)
        self.resume(name)
        return True

    def remove(self, name, retry=True):
        self._call('remove', name)
        if self.openers.get(name) and name in self.devices:
            raise exception.DMSetupCommandFailed(
                command='dmsetup remove %s' % name,
                reason='Device or resource busy')
        self.devices.pop(name, None)
        self.uuids.pop(name, None)
        self.hydration.pop(name, None)

    def exists(self, name):
        return name in self.devices

    def open_count(self, name):
        self._call('open_count', name)
        self._require(name)
        return self.openers.get(name, 0)

    def table(self, name):
        self._call('table', name)
        self._require(name)
        return list(self.devices[name])

    def status(self, name):
        self._require(name)
        return [dmsetup.StatusLine(s.start, s.length, s.target, '',
                                   self._clone_status(name, s)
                                   if s.target == 'clone' else None)
                for s in self.devices[name]]

    def _clone_status(self, name, seg):
        if name in self.failed:
            return dmsetup.FailedCloneStatus('Fail')
        args = dmsetup.parse_clone_table(seg)
        total = -(-seg.length // args.region_size)
        hydrated = min(self.meta_hydrated.get(args.metadata_dev, 0), total)
        features = tuple(f for f in args.features if f != 'no_hydration')
        if not self.hydration.get(name):
            features = ('no_hydration',) + features
        if self.cannot_discard and 'no_discard_passdown' not in features:
            # (dm-clone turns passdown off by itself over a destination
            # that cannot discard, and says so in its status.)
            features += ('no_discard_passdown',)
        return dmsetup.CloneStatus(
            metadata_block_size=8, metadata_used=10, metadata_total=4096,
            region_size=args.region_size, hydrated_regions=hydrated,
            total_regions=total, hydrating_regions=0, features=features,
            core_args=dict(args.core_args), read_only=name in self.read_only)

    def clone_statuses(self, errors=None):
        self._call('clone_statuses')
        result = {}
        for name in sorted(self.devices):
            seg = self._clone(name)
            if seg is not None:
                result[name] = self._clone_status(name, seg)
        return result

    def message(self, name, *words):
        self._call('message', name, *words)
        self._require(name)
        if self._clone(name) is None:
            raise exception.DMSetupCommandFailed(
                command='dmsetup message %s' % name,
                reason='Target does not support messages')
        if words[0] == 'enable_hydration':
            self.hydration[name] = True
        elif words[0] == 'disable_hydration':
            self.hydration[name] = False

    def hydrate(self, name, regions=None):
        """Let the background copy of a clone progress (test helper).

        Nothing moves while hydration is off, as in the kernel; returns
        the hydrated regions afterwards.
        """
        seg = self._clone(name)
        status = self._clone_status(name, seg)
        if not self.hydration.get(name):
            return status.hydrated_regions
        target = status.total_regions if regions is None else min(
            status.hydrated_regions + regions, status.total_regions)
        args = dmsetup.parse_clone_table(seg)
        self.meta_hydrated[args.metadata_dev] = target
        if target == status.total_regions and self.on_hydrated:
            self.on_hydrated(args.dest_dev)
        return target

    def write(self, name, regions=1):
        """An instance writes ``regions`` whole regions through a clone.

        dm-clone marks them hydrated whether hydration is on or off.
        """
        seg = self._clone(name)
        status = self._clone_status(name, seg)
        args = dmsetup.parse_clone_table(seg)
        self.meta_hydrated[args.metadata_dev] = min(
            status.hydrated_regions + regions, status.total_regions)

    def discard(self, name, start, sectors):
        """A discard of ``sectors`` from ``start`` through clone ``name``.

        As dm-clone: only the whole regions it covers count, each marked
        hydrated (once); ``check_discard(name, first, end)`` sees the
        regions first.  Returns how many were newly marked.
        """
        self._call('discard', name, start, sectors)
        self._require(name)
        seg = self._clone(name)
        if seg is None:
            raise exception.DMSetupCommandFailed(
                command='blkdiscard %s' % name, reason='not a clone')
        args = dmsetup.parse_clone_table(seg)
        rs = args.region_size
        first = -(-start // rs)
        end = min(start + sectors, seg.length) // rs
        if end <= first:
            return 0
        if self.check_discard is not None:
            self.check_discard(name, first, end)
        done = self.discarded.setdefault(args.metadata_dev, set())
        new = set(range(first, end)) - done
        done |= new
        status = self._clone_status(name, seg)
        self.meta_hydrated[args.metadata_dev] = min(
            status.hydrated_regions + len(new), status.total_regions)
        return len(new)

    def targets(self):
        self._call('targets')
        return dict(self.target_types)

    def version(self):
        self._call('version')
        return 'Library version: 1.02.185'

    def device_sectors(self, device):
        self._call('device_sectors', device)
        return self.sizes.get(device, 2097152)


def _size_bytes(size_str):
    """Bytes of an LVM size string as the driver writes them ('1g', '8m')."""
    units = {'g': 1024 ** 3, 'm': 1024 ** 2, 'k': 1024}
    return int(float(size_str[:-1]) * units[size_str[-1].lower()])


class FakeLVM(object):
    """A volume group: LVs in a dict, behind brick LVM's interface.

    LV sizes are mirrored into a FakeDMSetup's ``sizes`` (the LV's /dev
    path exists for tables exactly while the LV does).  Each LV remembers
    how often its head was zeroed and whether it holds complete data
    (``complete``: false for an LV a transfer created until its clone is
    fully hydrated).
    """

    def __init__(self, vg_name, dm=None):
        self.vg_name = vg_name
        self.dm = dm
        self.lvs = {}
        self.calls = []
        self.fail_on = {}
        self.vg_free_space = 1024.0   # GiB, as brick LVM reports it
        self.refreshed = 0

    def update_volume_group_info(self):
        """Brick re-reads vg_free_space here; the fake counts the calls."""
        self.refreshed += 1

    def _call(self, op, *args):
        self.calls.append((op,) + args)
        if op in self.fail_on:
            raise self.fail_on[op]

    def path(self, name):
        return '/dev/%s/%s' % (self.vg_name, name)

    def by_path(self, path):
        prefix = '/dev/%s/' % self.vg_name
        if path.startswith(prefix):
            return self.lvs.get(path[len(prefix):])
        return None

    def _sync(self, name):
        if self.dm is not None:
            self.dm.sizes[self.path(name)] = self.lvs[name]['bytes'] // 512

    def add(self, name, size_str, complete=True):
        """An LV that exists before the test starts."""
        self.lvs[name] = {'bytes': _size_bytes(size_str), 'zeroed': 0,
                          'complete': complete}
        self._sync(name)

    def get_volume(self, name):
        lv = self.lvs.get(name)
        if lv is None:
            return None
        return {'name': name, 'vg': self.vg_name,
                'size': '%.2f' % (lv['bytes'] / 1024 ** 3)}

    def get_volumes(self, lv_name=None):
        return [self.get_volume(n) for n in sorted(self.lvs)
                if lv_name is None or n == lv_name]

    def create_volume(self, name, size_str, lv_type='default',
                      mirror_count=0):
        self._call('create_volume', name, size_str, lv_type)
        if name in self.lvs:
            raise processutils.ProcessExecutionError(
                stderr='Logical Volume "%s" already exists' % name)
        self.add(name, size_str, complete=False)

    def delete(self, name):
        self._call('delete', name)
        if name not in self.lvs:
            raise processutils.ProcessExecutionError(
                stderr='Failed to find logical volume "%s"' % name)
        del self.lvs[name]
        if self.dm is not None:
            self.dm.sizes.pop(self.path(name), None)
            self.dm.meta_hydrated.pop(self.path(name), None)
            self.dm.discarded.pop(self.path(name), None)

    def rename_volume(self, name, new_name):
        self._call('rename_volume', name, new_name)
        if name not in self.lvs or new_name in self.lvs:
            raise processutils.ProcessExecutionError(
                stderr='cannot rename "%s" to "%s"' % (name, new_name))
        self.lvs[new_name] = self.lvs.pop(name)
        if self.dm is not None:
            for table in (self.dm.sizes, self.dm.meta_hydrated,
                          self.dm.discarded):
                if self.path(name) in table:
                    table[self.path(new_name)] = table.pop(self.path(name))

    def extend_volume(self, name, size_str):
        self._call('extend_volume', name, size_str)
        self.lvs[name]['bytes'] = _size_bytes(size_str)
        self._sync(name)

    def activate_lv(self, name, is_snapshot=False, permanent=False):
        self._call('activate_lv', name)

    def lv_has_snapshot(self, name):
        return False

    def zero(self, path):
        """What ``dd if=/dev/zero of=<path>`` does to the LV's head."""
        lv = self.by_path(path)
        lv['zeroed'] += 1
        if self.dm is not None:
            self.dm.meta_hydrated.pop(path, None)
            self.dm.discarded.pop(path, None)
        return lv


class FakeThinPool(object):
    """One thin pool of a node, behind the root commands that read it.

    :meth:`run` answers the commands :mod:`cinder_dmclone.privileged`
    builds for it (``lvs`` of a thin LV's id, of the pool's usage,
    ``dmsetup message`` of its metadata snapshot, ``dmsetup table`` of
    it, ``thin_dump``), with the kernel's answers and failures; None
    for any other command.  ``mapped`` holds each thin LV's mapped
    block ranges; ``held`` the metadata snapshot, which outlives a
    reboot (it is in the pool's superblock).
    """

    def __init__(self, vg, pool=None, block_sectors=128, zeroing=True):
        self.vg = vg
        self.pool = pool or '%s-pool' % vg
        self.block_sectors = block_sectors
        self.zeroing = zeroing
        #: the pool's size in bytes and the share of it in use (lvs).
        self.size = 1 << 40
        self.data_percent = 1.0
        self.mapped = {}
        self.thin_ids = {}
        self.held = False
        #: thin LVs with an external origin (reads it where unmapped).
        self.external = set()
        self.calls = []
        #: word of a command (reserve_metadata_snap, thin_dump...) -> the
        #: exception it raises instead.
        self.fail_on = {}
        #: blank bytes thin_dump writes before its XML (a dump larger than
        #: its mappings explain).
        self.dump_padding = 0
        #: as LVM: a pool with no thin LV is not active, its -tpool
        #: device missing (dmsetup table fails), until one is made (an LV
        #: of the volume group, as the cluster's nodes pass them).
        self.inactive_when_empty = False

    @property
    def device(self):
        return '%s-%s-tpool' % (self.vg.replace('-', '--'),
                                self.pool.replace('-', '--'))

    def add(self, lv, ranges):
        """Thin LV ``lv`` mapping the block ranges ``[(first, end)]``."""
        self.thin_ids.setdefault(lv, len(self.thin_ids) + 1)
        self.mapped[lv] = list(ranges)

    def _failed(self, text):
        return processutils.ProcessExecutionError(
            exit_code=1, stderr='device-mapper: message ioctl on %s  '
            'failed: %s\nCommand failed.\n' % (self.device, text))

    def run(self, cmd, lvs=None):
        """(stdout, stderr) of ``cmd`` (without the env prefix), or None.

        ``lvs``: {LV name: bytes} of the volume group, for the pool's
        usage report.
        """
        cmd = tuple(cmd)
        word = None
        if cmd[:1] == ('lvs',) and 'thin_id,pool_lv' in cmd:
            word = 'thin_device'
        elif cmd[:1] == ('lvs',) and cmd[-1] == self.vg:
            word = 'thin_lvs'
        elif cmd[:3] == ('dmsetup', 'message', self.device):
            word = cmd[-1]
        elif cmd[:3] == ('dmsetup', 'table', self.device):
            word = 'table'
        elif cmd[:3] == ('lvs', '--noheadings', '--binary'):
            word = 'zero_recorded'
        elif cmd[:2] == ('dmsetup', 'table') and cmd[2] in self._lv_devices():
            word = 'thin_table'
        elif cmd[:2] == ('dmsetup', 'status') and \
                cmd[2] in self._lv_devices():
            word = 'thin_status'
        elif cmd[:1] == ('thin_dump',):
            word = 'thin_dump'
        if word is None:
            return None
        self.calls.append(word)
        if word in self.fail_on:
            raise self.fail_on[word]
        return getattr(self, '_' + word)(cmd, lvs or {})

    def _lv_devices(self):
        return {'%s-%s' % (self.vg.replace('-', '--'), lv.replace('-', '--')):
                lv for lv in self.thin_ids}

    def _thin_table(self, cmd, lvs):
        lv = self._lv_devices()[cmd[2]]
        origin = ' 253:9' if lv in self.external else ''
        return ('0 2097152 thin 253:3 %d%s\n' % (self.thin_ids[lv], origin),
                '')

    def _thin_status(self, cmd, lvs):
        mapped = sum(e - f for f, e in self.mapped.get(
            self._lv_devices()[cmd[2]], ()))
        if not mapped:
            return '0 2097152 thin 0 -\n', ''
        return '0 2097152 thin %d %d\n' % (
            mapped * self.block_sectors, 2097151), ''

    def _thin_device(self, cmd, lvs):
        lv = cmd[-1].split('/', 1)[1]
        if lv not in self.thin_ids:
            return '  |\n', ''
        return '  %d|%s\n' % (self.thin_ids[lv], self.pool), ''

    def _thin_lvs(self, cmd, lvs):
        lines = ['  %s|%d|%.2f|1.00|1073741824|%d|' % (
            self.pool, self.size, self.data_percent,
            self.block_sectors * 512)]
        for name, size in sorted(lvs.items()):
            lines.append('  %s|%d|0.00|||0|%s' % (name, size, self.pool))
        return '\n'.join(lines) + '\n', ''

    def _reserve_metadata_snap(self, cmd, lvs):
        if self.held:
            raise self._failed('Device or resource busy')
        self.held = True
        return '', ''

    def _release_metadata_snap(self, cmd, lvs):
        if not self.held:
            raise self._failed('Invalid argument')
        self.held = False
        return '', ''

    def _zero_recorded(self, cmd, lvs):
        return '  %d\n' % (1 if self.zeroing else 0), ''

    def _table(self, cmd, lvs):
        if self.inactive_when_empty and not (self.thin_ids or lvs):
            raise processutils.ProcessExecutionError(
                exit_code=1, stderr='device-mapper: table ioctl on %s  '
                'failed: No such device or address\nCommand failed.\n'
                % self.device)
        features = ' 0' if self.zeroing else ' 1 skip_block_zeroing'
        return '0 2097152 thin-pool 253:1 253:2 %d 0%s\n' % (
            self.block_sectors, features), ''

    def _thin_dump(self, cmd, lvs):
        if not self.held:
            raise processutils.ProcessExecutionError(
                exit_code=1, stderr='no current metadata snap')
        dev_id = int(cmd[cmd.index('--dev-id') + 1])
        devices = []
        for lv, thin_id in sorted(self.thin_ids.items()):
            if thin_id != dev_id:
                continue
            body = ''.join(
                '<range_mapping origin_begin="%d" data_begin="0" '
                'length="%d" time="0"/>' % (first, end - first)
                for first, end in self.mapped.get(lv, ()))
            devices.append('<device dev_id="%d" mapped_blocks="%d">%s'
                           '</device>' % (thin_id, sum(
                               e - f for f, e in self.mapped.get(lv, ())),
                               body))
        return (' ' * self.dump_padding
                + '<superblock data_block_size="%d">%s</superblock>'
                % (self.block_sectors, ''.join(devices))), ''


class FakeConnector(object):
    """os-brick's iSCSI connector on one node: sessions in a dict.

    ``resolve(props)`` returns the size in sectors of the exported device
    the properties name (raising like os-brick when it cannot log in); a
    session's device exists in the node's FakeDMSetup while it is logged in.
    """

    def __init__(self, dm, resolve, on_disconnect=None):
        self.dm = dm
        self.resolve = resolve
        self.on_disconnect = on_disconnect
        self.sessions = {}
        self.calls = []

    @staticmethod
    def device(props):
        return '/dev/disk/by-path/ip-%s-iscsi-%s-lun-%d' % (
            props['target_portal'], props['target_iqn'], props['target_lun'])

    def connect_volume(self, props):
        self.calls.append(('connect_volume', props))
        sectors = self.resolve(props)
        path = self.device(props)
        self.sessions[props['target_iqn']] = path
        self.dm.sizes[path] = sectors
        return {'type': 'block', 'path': path}

    def disconnect_volume(self, props, device_info, force=False,
                          ignore_errors=False):
        self.calls.append(('disconnect_volume', props, device_info, force,
                           ignore_errors))
        path = self.sessions.pop(props['target_iqn'], None)
        if path is not None:
            if self.on_disconnect is not None:
                self.on_disconnect(path)
            self.dm.sizes.pop(path, None)


class FakeTarget(object):
    """Cinder's iSCSI target driver on one node: exports and their ACLs.

    ``exports`` is the kernel's (gone with a reboot: :meth:`reboot`),
    ``saved`` LIO's saveconfig.json, written after every change as
    Cinder's LIO helper does; :meth:`ensure_export` restores every saved
    target when the kernel has none, each only if its device exists
    (``device_exists``, the node's device-mapper), as rtslib's restore.
    """

    def __init__(self, ip, device_exists=lambda path: True):
        self.ip = ip
        self.exports = {}
        self.saved = {}
        self.calls = []
        self.device_exists = device_exists

    def _persist(self):
        self.saved = copy.deepcopy(self.exports)

    def reboot(self):
        self.exports.clear()

    def ensure_export(self, context, volume, path):
        self.calls.append(('ensure_export', volume['id'], path))
        if self.exports:
            return
        for iqn, export in self.saved.items():
            if self.device_exists(export['path']):
                self.exports[iqn] = copy.deepcopy(export)

    @staticmethod
    def iqn(volume):
        return 'iqn.2010-10.org.openstack:%s' % volume['name']

    def create_export(self, context, volume, path):
        self.calls.append(('create_export', volume['id'], path))
        self.exports.setdefault(self.iqn(volume), {
            'volume_id': volume['id'], 'path': path, 'acl': set()})
        self._persist()
        return {'location': '%s:3260,1 %s 0' % (self.ip, self.iqn(volume)),
                'auth': 'CHAP user s3cret'}

    def initialize_connection(self, volume, connector):
        self.calls.append(('initialize_connection', volume['id'],
                           connector.get('initiator')))
        self.exports[self.iqn(volume)]['acl'].add(connector['initiator'])
        self._persist()
        return {'driver_volume_type': 'iscsi',
                'data': {'target_portal': '%s:3260' % self.ip,
                         'target_iqn': self.iqn(volume), 'target_lun': 0,
                         'target_discovered': False,
                         'volume_id': volume['id']}}

    def terminate_connection(self, volume, connector, **kwargs):
        """Drop the initiator from the export's ACL.

        As LIO's helper does: nothing without a ``provider_location``,
        and ISCSITargetDetachFailed when the record names a target that no
        longer exists (``cinder-rtstool delete-initiator`` exits 1 with
        "Could not find target").
        """
        self.calls.append(('terminate_connection', volume['id'],
                           (connector or {}).get('initiator')))
        if volume.get('provider_location') is None:
            return
        export = self.exports.get(self.iqn(volume))
        if export is None:
            raise cinder_exception.ISCSITargetDetachFailed(
                volume_id=volume['id'])
        export['acl'].discard((connector or {}).get('initiator'))
        self._persist()

    def remove_export(self, context, volume):
        self.calls.append(('remove_export', volume['id']))
        self.exports.pop(self.iqn(volume), None)
        self._persist()


class FakeDB(object):
    """The part of cinder.db the move Store and both sides use.

    Admin metadata is a dict of strings per volume, as in the database;
    a volume that is not in ``volumes`` raises VolumeNotFound like the
    real calls decorated with require_volume_exists.
    """

    def __init__(self):
        self.volumes = {}
        self.admin_metadata = {}
        self.calls = []
        self.fail_on = {}

    def _call(self, op, volume_id, *args):
        self.calls.append((op, volume_id) + args)
        if op in self.fail_on:
            raise self.fail_on[op]
        if volume_id not in self.volumes:
            raise cinder_exception.VolumeNotFound(volume_id=volume_id)

    def volume_admin_metadata_get(self, ctxt, volume_id):
        self._call('volume_admin_metadata_get', volume_id)
        return dict(self.admin_metadata.get(volume_id, {}))

    def volume_admin_metadata_update(self, ctxt, volume_id, metadata, delete,
                                     add=True, update=True):
        self._call('volume_admin_metadata_update', volume_id, dict(metadata),
                   delete)
        md = self.admin_metadata.setdefault(volume_id, {})
        if delete:
            for key in list(md):
                if key not in metadata:
                    del md[key]
        md.update({k: str(v) for k, v in metadata.items()})
        return dict(md)

    def volume_admin_metadata_delete(self, ctxt, volume_id, key):
        self._call('volume_admin_metadata_delete', volume_id, key)
        self.admin_metadata.get(volume_id, {}).pop(key, None)

    def volume_update(self, ctxt, volume_id, values):
        self._call('volume_update', volume_id, dict(values))
        self.volumes[volume_id].update(values)
