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

"""The source's side of the thin map: which regions a thin LV holds.

A move whose source LV nobody writes (see
doc/source/contributor/thin-map.rst) sends the destination the regions
its thin LV maps; the destination marks the others hydrated without
copying them.  :class:`ThinMaps` reads them from the pool's metadata:
``lvs`` for the LV's thin id and pool, the LV's own table (a thin LV
with an external origin reads that origin, not zeroes, where nothing is
mapped: no map), how much the LV maps (a tenant decides how fragmented
it is: past ``dmclone_thin_map_max_mappings`` there is no map), then,
under the pool's lock, a metadata snapshot of the pool, ``thin_dump`` of
it (read as it comes, cut past the bytes that many mappings take) and
the snapshot's release, always.  The
commands are :mod:`cinder_dmclone.privileged`'s, the arithmetic
:mod:`cinder_dmclone.thin`'s.

A metadata snapshot is held in the pool's superblock: it survives a crash
and a reboot, keeps the blocks it references allocated, and a pool holds
one at a time.  So each reservation is recorded first, in a file named
after the pool under the service's state directory (written and synced
before the reserve, removed once the snapshot is released): a snapshot
with a record is this service's leftover and is released (at start, and
when a reserve finds the pool busy); one without is another tool's and is
left alone.

The map is an optimisation: any failure to take it is logged and the move
copies every region, as it would without one.
"""

import contextlib
import errno
import functools
import os
import stat
import urllib.parse

from oslo_log import log as logging
import tenacity

from cinder_dmclone import dmsetup
from cinder_dmclone import exception
from cinder_dmclone import layout
from cinder_dmclone import move
from cinder_dmclone import privileged
from cinder_dmclone import thin

LOG = logging.getLogger(__name__)

#: Suffix of a reservation record's file name.
RECORD_SUFFIX = '.metasnap'


#: A record is one short line: never more is read.
RECORD_MAX_BYTES = 4096


def _read_record(path):
    """The fields of the record at ``path``: a plain file, never a link.

    Root's abandon-source reads the records too, in a directory the
    service's user owns: a link is not followed, and a FIFO or a device
    planted there is neither waited on nor read (OSError).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EPERM, 'not a plain record file', path)
        return os.read(fd, RECORD_MAX_BYTES).decode('utf-8',
                                                    'replace').split()
    finally:
        os.close(fd)


def _owned_like(directory, target):
    """Give ``target`` ``directory``'s owner, when this process is root.

    The operator's command (``cinder-dmclone move abandon-source``) runs
    as root and takes maps in the service's directory; a record it left
    (a release that failed) must stay the service's to rewrite and
    release, as the service's own are.  ``target`` is an open file's
    descriptor or a path, never followed: the directory is the
    service's, and root must not give it whatever a link there names.
    """
    if os.geteuid() != 0:
        return
    owner = os.stat(directory)
    if isinstance(target, int):
        os.fchown(target, owner.st_uid, owner.st_gid)
    else:
        os.chown(target, owner.st_uid, owner.st_gid, follow_symlinks=False)


def _wait_ended():
    """The exceptions by which a tooz lock says its bounded wait ran out.

    kazoo (tooz's zookeeper driver) is imported only where it is
    installed.
    """
    try:
        from kazoo import exceptions as kazoo_exceptions
    except ImportError:
        return (tenacity.RetryError,)
    return (tenacity.RetryError, kazoo_exceptions.LockTimeout)


class ThinMaps(object):
    """Takes the region map of a thin LV of volume group ``vg_name``.

    ``record_dir`` holds the reservation records (created when first
    needed); ``lock(vg, pool)`` is the pool's lock
    (:func:`cinder_dmclone.move.pool_lock`); ``execute`` and
    ``root_helper`` run the root commands.
    """

    #: Seconds a move's attempt allows for taking its map (waiting for
    #: the pool's lock behind the other moves of the pool, then
    #: ``thin_dump``), on top of its prepare's budget: the source
    #: records the move before it takes the map (the map is taken only
    #: once the attachments read after the record allow it).  A map
    #: slower than this eats into the prepare's time; should the
    #: attempt then pass its recorded deadline, its commit is refused
    #: (MoveDeadlinePassed) and the move given up, as any late attempt.
    TIME_LIMIT = 60

    #: Seconds a move's or a start's reader waits for the pool's lock
    #: (behind another reader's dump) before it does without the map:
    #: half the map's budget, the other half is the dump's.
    LOCK_WAIT = TIME_LIMIT // 2

    #: ``dmclone_thin_map_max_mappings``'s default.
    MAX_MAPPINGS = 1000000

    def __init__(self, node_name, vg_name, record_dir, execute=None,
                 root_helper=None, lock=None, stream=None,
                 max_mappings=MAX_MAPPINGS, lock_wait=LOCK_WAIT):
        self.node_name = node_name
        self.vg_name = layout.validate_vg_name(vg_name)
        self.record_dir = record_dir
        self._kw = {'execute': execute, 'root_helper': root_helper}
        self._lock = lock
        #: what runs thin_dump and yields its output (see
        #: :func:`privileged.thin_dump <cinder_dmclone.privileged.
        #: thin_dump>`); None: ``execute``'s whole output, in pieces.
        self._stream = stream
        #: the most mappings a map may read (its thin LV's mapped blocks
        #: bound them before the dump; the dump is cut past the bytes
        #: they take).
        self.max_mappings = max_mappings
        #: seconds to wait for the pool's lock; None: as long as it takes
        #: (the operator's command, which says that it waits).
        self.lock_wait = lock_wait

    @property
    def _owner(self):
        """The node's name as its records carry it (no blank, no slash)."""
        return urllib.parse.quote(self.node_name, safe='')

    @contextlib.contextmanager
    def _pool_lock(self, pool):
        """Hold the pool's lock, waited for at most :attr:`lock_wait`.

        Whatever holds it for good (a dump stuck on a failing disk, a
        coordination backend that never takes the release) must not
        hold a prepare or a start for good: PoolLockTimeout, and the
        caller does without the map.  A lock the backend says was no
        longer ours at its release (a lease that ran out: another
        reader may have released and taken the pool's snapshot while
        this one dumped it) raises PoolLockLost, so that what was read
        under it is not used.
        """
        lock = (self._lock or move.pool_lock)(self.vg_name, pool)
        if not lock.acquire(blocking=False):
            LOG.info('Thin pool %(vg)s/%(pool)s is being read by another '
                     'reader: waiting for it (%(bound)s).',
                     {'vg': self.vg_name, 'pool': pool,
                      'bound': ('no bound' if self.lock_wait is None
                                else '%s s at most' % self.lock_wait)})
            if not self._wait_for(lock):
                raise exception.PoolLockTimeout(vg=self.vg_name, pool=pool,
                                                seconds=self.lock_wait)
        try:
            yield
        finally:
            if lock.release() is False:
                raise exception.PoolLockLost(vg=self.vg_name, pool=pool)

    def _wait_for(self, lock):
        """Wait for ``lock`` up to :attr:`lock_wait`; True once held.

        tooz's drivers end a bounded wait three ways: False (file,
        redis), tenacity's RetryError (etcd3gw, mysql, pgsql, memcached:
        their retries ran out on a lock held elsewhere) or kazoo's
        LockTimeout (zookeeper).  Each is the wait's end.  Any other
        failure of the backend is raised as it is.
        """
        try:
            return lock.acquire(
                blocking=True if self.lock_wait is None else self.lock_wait)
        except _wait_ended():
            return False

    # -- taking a map -------------------------------------------------------

    def take(self, lv_name, clone_sectors, region_sectors):
        """The encoded map of LV ``lv_name``'s first ``clone_sectors``.

        :func:`thin.encode_regions <cinder_dmclone.thin.encode_regions>`
        of the regions of ``region_sectors`` that hold mapped blocks, or
        None (copy every region) when the LV is not thin or the map
        cannot be taken.  The caller guarantees that nothing writes to
        the LV from now until the move stops reading it.
        """
        read = self._read(lv_name, 'every region of it is copied')
        if read is None:
            return None
        pool, device_map = read
        try:
            needed = thin.needed_regions(device_map, clone_sectors,
                                         region_sectors)
            total = dmsetup.region_count(clone_sectors, region_sectors)
            token = thin.encode_regions(needed, total, region_sectors)
        except Exception:
            LOG.warning('Could not encode the map of thin LV %(vg)s/%(lv)s: '
                        'every region of it is copied.',
                        {'vg': self.vg_name, 'lv': lv_name}, exc_info=True)
            return None
        LOG.info('Thin LV %(vg)s/%(lv)s maps %(blocks)d blocks of pool '
                 '%(pool)s: %(needed)d of its %(total)d regions hold data.',
                 {'vg': self.vg_name, 'lv': lv_name, 'pool': pool,
                  'blocks': device_map.mapped_blocks, 'total': total,
                  'needed': sum(e - f for f, e in needed)})
        return token

    def zeroing_map(self, lv_name):
        """What thin LV ``lv_name`` maps, if its pool zeroes new blocks.

        For zeroing the ranges of a volume that were never copied
        (:mod:`cinder_dmclone.lost_source`): of a thin LV only the parts
        in blocks it maps need zeroes written (:func:`thin.mapped_parts
        <cinder_dmclone.thin.mapped_parts>`), provided a block mapped
        later reads zeroes around what maps it.  None, and every range
        is to be written: the LV is not thin, its pool keeps
        ``skip_block_zeroing`` (a block a later write maps shows what it
        held before), or the map cannot be read.  The caller guarantees
        that nothing writes to those ranges from now on.
        """
        otherwise = 'every range of it is written'
        # The flag is read before the snapshot and again after it: a
        # block mapped since the snapshot (by a write into a copied part
        # of it) is left unwritten, so it must have been zeroed when the
        # pool mapped it; a pool that zeroes only once the dump is taken
        # may have mapped it with its old data.
        read = self._read(lv_name, otherwise, check=functools.partial(
            self._zeroes, lv_name=lv_name, otherwise=otherwise))
        if read is None:
            return None
        pool, device_map = read
        if not self._zeroes(pool, lv_name, otherwise):
            return None
        return device_map

    def _zeroes(self, pool, lv_name, otherwise):
        """True if the pool zeroes new blocks now; else logged, False."""
        try:
            if privileged.pool_zeroes(self.vg_name, pool, **self._kw):
                return True
        except Exception as exc:
            LOG.info('Whether thin pool %(vg)s/%(pool)s zeroes new blocks '
                     'cannot be read (%(exc)s): %(otherwise)s (LV %(lv)s).',
                     {'vg': self.vg_name, 'pool': pool, 'lv': lv_name,
                      'exc': exc, 'otherwise': otherwise})
            return False
        LOG.info('Thin pool %(vg)s/%(pool)s does not zero the blocks it '
                 'maps: %(otherwise)s (LV %(lv)s).',
                 {'vg': self.vg_name, 'pool': pool, 'lv': lv_name,
                  'otherwise': otherwise})
        return False

    def _read(self, lv_name, otherwise, check=None):
        """(pool, :class:`thin.DeviceMap`) of thin LV ``lv_name``, or None.

        None, logged with ``otherwise`` (what the caller does instead),
        when the LV is not a thin LV whose pool tells where its data is,
        maps more than the bound, ``check(pool)`` (before the snapshot)
        says no, or its dump fails.
        """
        try:
            thin_id, pool = privileged.thin_device(self.vg_name, lv_name,
                                                   **self._kw)
            thin.check_thin_table(
                privileged.thin_table(self.vg_name, lv_name, **self._kw),
                thin_id, thin.lv_device(self.vg_name, lv_name))
        except Exception as exc:
            # (LVSParseError of a thick LV, ThinTableInvalid, a failed or
            # refused command, and anything else: the map is never a
            # reason to refuse the move.)
            LOG.info('LV %(vg)s/%(lv)s is not a thin LV whose pool tells '
                     'where its data is (%(exc)s): %(otherwise)s.',
                     {'vg': self.vg_name, 'lv': lv_name, 'exc': exc,
                      'otherwise': otherwise})
            return None
        if not self._within_bound(lv_name, pool, otherwise):
            return None
        if check is not None and not check(pool):
            return None
        try:
            with self._pool_lock(pool):
                return pool, self._dump(pool, thin_id)
        except Exception:
            LOG.warning('Could not read what thin LV %(vg)s/%(lv)s maps '
                        'from pool %(pool)s: %(otherwise)s.',
                        {'vg': self.vg_name, 'lv': lv_name, 'pool': pool,
                         'otherwise': otherwise}, exc_info=True)
            return None

    def _within_bound(self, lv_name, pool, otherwise):
        """True if LV ``lv_name``'s dump holds at most ``max_mappings``.

        Before any snapshot, from the kernel's count of the sectors the
        thin LV maps and its pool's block size: every mapping of a dump
        holds at least one block (:func:`thin.mappings_bound
        <cinder_dmclone.thin.mappings_bound>`).  A tenant decides how
        fragmented its LV is; a dump past the bound is not taken (the
        caller does ``otherwise``: a move copies every region), so what a
        map costs here (the dump read, the ranges kept) stays bounded
        whatever the LV holds.
        """
        try:
            mapped = privileged.thin_mapped_sectors(self.vg_name, lv_name,
                                                    **self._kw)
            block = privileged.pool_block_sectors(self.vg_name, pool,
                                                  **self._kw)
        except Exception as exc:
            LOG.info('How much thin LV %(vg)s/%(lv)s maps cannot be read '
                     '(%(exc)s): %(otherwise)s.',
                     {'vg': self.vg_name, 'lv': lv_name, 'exc': exc,
                      'otherwise': otherwise})
            return False
        bound = thin.mappings_bound(mapped, block)
        if bound <= self.max_mappings:
            return True
        LOG.info('Thin LV %(vg)s/%(lv)s maps %(blocks)d blocks of pool '
                 '%(pool)s, and its map may hold as many pieces: more than '
                 'dmclone_thin_map_max_mappings (%(max)d), so no map is '
                 'taken: %(otherwise)s.',
                 {'vg': self.vg_name, 'lv': lv_name, 'pool': pool,
                  'blocks': bound, 'max': self.max_mappings,
                  'otherwise': otherwise})
        return False

    def _dump(self, pool, thin_id):
        """``thin_dump`` of device ``thin_id`` from a snapshot of ``pool``.

        Under the pool's lock.  Read as it comes and never past the
        bytes ``max_mappings`` mappings take (:func:`thin.dump_bytes_bound
        <cinder_dmclone.thin.dump_bytes_bound>`): a larger dump raises
        ThinDumpTooLarge.  The snapshot is released whatever happens
        after it was reserved; if that release finds none held, someone
        released it while the dump read it, and MetadataSnapReleased
        means no map.
        """
        self._reserve(pool)
        try:
            dumped = privileged.thin_dump(
                self.vg_name, pool, thin_id, stream=self._stream,
                max_bytes=thin.dump_bytes_bound(self.max_mappings),
                max_mappings=self.max_mappings, **self._kw)
        except BaseException:
            self.release(pool)
            raise
        # None held at our release: someone released it while the dump
        # read it, and the live pool may have reused blocks the dump
        # walked (a torn map would take written regions as unneeded).
        if not self.release(pool):
            raise exception.MetadataSnapReleased(vg=self.vg_name, pool=pool)
        return dumped

    def _reserve(self, pool):
        """Reserve the pool's metadata snapshot, recorded first.

        A pool already holding one (MetadataSnapBusy): if a record of
        ours was there before this attempt, the snapshot is a leftover
        of this service (a crash between reserve and release) and is
        released, then reserved again, once.  Without one it belongs to
        another tool: left alone, and the error raised.  A reserve that
        fails otherwise took nothing (the kernel refused the message, or
        it never ran): its record goes.
        """
        leftover = self.recorded(pool)
        self._write_record(pool)
        try:
            self._reserve_or_forget(pool)
            return
        except exception.MetadataSnapBusy:
            if not leftover:
                self._remove_record(pool)
                LOG.error('Thin pool %(vg)s/%(pool)s holds a metadata '
                          'snapshot this service did not take (another '
                          'tool\'s, or one whose record was lost): it is '
                          'left alone, and moves from this pool copy every '
                          'region until an operator releases it ("dmsetup '
                          'message %(dev)s 0 release_metadata_snap").',
                          {'vg': self.vg_name, 'pool': pool,
                           'dev': thin.pool_device(self.vg_name, pool)})
                raise
        LOG.warning('Thin pool %(vg)s/%(pool)s still held a metadata '
                    'snapshot this service took earlier and did not '
                    'release (it stopped, or the release failed): '
                    'releasing it.', {'vg': self.vg_name, 'pool': pool})
        self.release(pool)
        self._write_record(pool)
        try:
            self._reserve_or_forget(pool)
        except exception.MetadataSnapBusy:
            self._remove_record(pool)
            raise

    def _reserve_or_forget(self, pool):
        """reserve_metadata_snap; its record goes if it failed otherwise."""
        try:
            privileged.reserve_metadata_snap(self.vg_name, pool, **self._kw)
        except exception.MetadataSnapBusy:
            raise
        except Exception:
            self._remove_record(pool)
            raise

    def release(self, pool):
        """Release the pool's metadata snapshot, then forget its record.

        None held counts as released.  A failure keeps the record (and
        raises): the next reserve of the pool, or the next start,
        releases it.
        """
        released = privileged.release_metadata_snap(self.vg_name, pool,
                                                    **self._kw)
        self._remove_record(pool)
        return released

    # -- start ----------------------------------------------------------------

    def release_leftovers(self):
        """At service start: release the snapshots whose records remain.

        A crash or a reboot between a reserve and its release left them
        (the snapshot outlives both).  Never raises; a snapshot that
        cannot be released now keeps its record for the next attempt.
        """
        for pool in self.recorded_pools():
            try:
                with self._pool_lock(pool):
                    held = self.release(pool)
            except Exception:
                LOG.warning('Could not release the metadata snapshot this '
                            'service recorded for thin pool %(vg)s/'
                            '%(pool)s; retried when a move next reads the '
                            'pool, or at the next start.',
                            {'vg': self.vg_name, 'pool': pool},
                            exc_info=True)
                continue
            if held:
                LOG.warning('Released the metadata snapshot of thin pool '
                            '%(vg)s/%(pool)s that a move from this node '
                            'left held (the service stopped while reading '
                            'the pool).', {'vg': self.vg_name, 'pool': pool})

    # -- records ------------------------------------------------------------

    def _record_path(self, pool, owner=True):
        """The path of this node's record of ``pool``'s reservation.

        Named after the node: two volume services of one host may share
        a record directory and a volume group under two node names, and
        each must see only its own records (another service's is
        foreign: its snapshot is never released here).  Their pool's
        lock (:func:`~cinder_dmclone.move.pool_lock`) is one, so neither
        releases a snapshot while the other reads it.
        ``owner=False``: the path of a record of a release that named no
        node.
        """
        name = thin.pool_device(self.vg_name, pool)
        if owner:
            name += '.' + self._owner
        return os.path.join(self.record_dir, name + RECORD_SUFFIX)

    def recorded(self, pool):
        """True if this node recorded a reservation of ``pool``."""
        return os.path.exists(self._record_path(pool))

    def recorded_pools(self):
        """The pools of this volume group with a recorded reservation.

        A record directory this service cannot list (one that the
        operator command, run as root, created with root's umask; a file
        at its path) is logged and counts as none: the start must go on,
        whether or not ``dmclone_thin_map`` is on.
        """
        try:
            names = sorted(os.listdir(self.record_dir))
        except FileNotFoundError:
            return []
        except OSError:
            LOG.warning('Cannot list %s: no metadata snapshot recorded '
                        'there is released (thin pools of %s).',
                        self.record_dir, self.vg_name, exc_info=True)
            return []
        pools = []
        for name in names:
            if not name.endswith(RECORD_SUFFIX):
                continue
            try:
                fields = _read_record(os.path.join(self.record_dir, name))
                vg, pool = fields[:2]
                owner = fields[2] if len(fields) == 3 else None
                if len(fields) > 3:
                    raise ValueError(name)
                layout.validate_lv_name(pool)
            except (OSError, ValueError, exception.InvalidDMName):
                LOG.warning('Ignoring %s: not a metadata snapshot record '
                            'of this service.', name)
                continue
            if vg != self.vg_name:
                continue
            if owner == self._owner and name == os.path.basename(
                    self._record_path(pool)):
                pools.append(pool)
            elif owner is None and name == os.path.basename(
                    self._record_path(pool, owner=False)):
                # (Left by a release that named no node: this service's
                # own, as that release took it for.)
                pools.append(pool)
        return sorted(set(pools))

    def _write_record(self, pool):
        """Record a reservation of ``pool``, on disk before it is made."""
        if not os.path.isdir(self.record_dir):
            os.makedirs(self.record_dir, exist_ok=True)
            _owned_like(os.path.dirname(os.path.abspath(self.record_dir)),
                        self.record_dir)
        path = self._record_path(pool)
        # Never through a link (root's command writes here, into a
        # directory the service's user owns): no follow, a plain file
        # with one name, truncated only once checked.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW |
                     os.O_NONBLOCK, 0o644)
        with os.fdopen(fd, 'w') as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                raise OSError(errno.EPERM, 'not a plain record file', path)
            os.ftruncate(fd, 0)
            _owned_like(self.record_dir, f.fileno())
            f.write('%s %s %s\n' % (self.vg_name, pool, self._owner))
            f.flush()
            os.fsync(f.fileno())
        self._sync_dir()

    def _remove_record(self, pool):
        """Forget this node's record of ``pool`` (and an unowned one)."""
        removed = False
        for owner in (True, False):
            try:
                os.unlink(self._record_path(pool, owner))
                removed = True
            except FileNotFoundError:
                pass
        if removed:
            self._sync_dir()

    def _sync_dir(self):
        fd = os.open(self.record_dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
