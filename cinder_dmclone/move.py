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

"""A volume moving from one node to another: its record and its store.

A move takes a volume from its *source* node (where its LV is) to a
*destination* node (where an instance attaches it).  Its record lives in
the volume's admin metadata (keys ``dmclone_*``), so every service can tell
where a volume is in its move; :class:`Store` is the only code that reads
or writes it, and every change of state is a compare-and-set made under
the volume's lock (:func:`lock`).  Each step of a move is idempotent, so a
service that crashed anywhere resumes by running the next step again:

=================  ===========================================================
state              meaning, and what recovery on the destination does
=================  ===========================================================
``preparing``      the source asked the destination to build the clone; it
                   may be half built.  Recovery rolls the destination back
                   (never reuses a metadata LV that may not be initialised).
                   The source commits it (to ``cloned`` or ``hydrating``)
                   only before the deadline it recorded with it.  One whose
                   volume record names its destination was committed, then
                   set back by a stale whole save of the admin metadata:
                   the destination rolls it forward (Store.roll_forward).
``cloned``         the clone serves I/O on the destination, hydration is off
                   because the source may still have an attachment (live
                   migration).  Recovery rebuilds the clone, hydration off.
``hydrating``      the move is committed; the clone copies in the background.
                   Recovery rebuilds the clone with hydration on.
``finalizing``     hydration finished; the handle is (being) swapped to a
                   linear table and the source cleaned up.  Recovery runs
                   the finalisation again.
``aborted``        the source gave the move up while the destination could
                   not be reached to drop its side (it died mid-prepare, or
                   never answered).  The volume stays, usable, on the
                   source; nothing treats it as moving.  The destination's
                   recovery (or its monitor) removes what it built and
                   clears the state; the source's restart asks it again.
``source_lost``    an operator ends the move on the destination because
                   its source is lost for good (``cinder-dmclone move
                   abandon-source``, :mod:`cinder_dmclone.lost_source`):
                   the regions never copied are zeroed and the clone
                   replaced.  Neither node's service acts on it (recovery
                   logs it); running the command again finishes it.  It
                   ends with the move cleared, the volume in ``error`` and
                   the loss recorded (:data:`LOSS_KEYS`).
=================  ===========================================================

(Cinder's own "volume transfer" hands a volume to another project; this
driver's moves are unrelated to it.  The persisted keys and the options
keep the word ``transfer`` they were released with.)
"""

import contextlib
import dataclasses
import functools
import hashlib
import hmac
import re
import secrets
import time
import typing
import urllib.parse

from oslo_concurrency import lockutils
from oslo_log import log as logging

from cinder import coordination
from cinder import exception
from cinder.i18n import _

from cinder_dmclone import dmsetup
from cinder_dmclone import exception as dmc_exception
from cinder_dmclone import layout

LOG = logging.getLogger(__name__)

PREPARING = 'preparing'
CLONED = 'cloned'
HYDRATING = 'hydrating'
FINALIZING = 'finalizing'
ABORTED = 'aborted'
SOURCE_LOST = 'source_lost'
STATES = (PREPARING, CLONED, HYDRATING, FINALIZING, ABORTED, SOURCE_LOST)
#: The states of a move whose source may still give it up: none of them
#: lets its destination hydrate (from ``hydrating`` on, the move is
#: committed and its clone is the volume).
UNCOMMITTED = (PREPARING, CLONED, ABORTED)
#: The states of a move in which its destination's LV is known whole
#: (hydration complete): in any other (``source_lost`` too: an abandon
#: zeroes what was never copied only at its end) only the clone may
#: serve it, never a linear map of the LV alone.
WHOLE_AT_DEST = (FINALIZING,)

KEY_PREFIX = 'dmclone_'
#: bytes of randomness in a move's secret (hex encoded in the record).
SECRET_BYTES = 16
PROGRESS_KEYS = ('hydrated_regions', 'total_regions', 'percent', 'rate_bps',
                 'eta_seconds', 'stalled_seconds', 'stale_source_attachment',
                 'awaiting_source')
#: What a move ended over a lost source leaves in the record (they stay
#: after the move is cleared, until an operator removes them): the lost
#: node, when, how many regions and bytes were never copied, their byte
#: ranges (``offset+length``, cut to fit Cinder's 255 characters), the
#: file with all of them, and what the lost node still holds.
LOSS_KEYS = ('lost_source', 'lost_at', 'lost_regions', 'lost_bytes',
             'lost_ranges', 'lost_ranges_file', 'lost_source_lv',
             'lost_source_target')
#: Cinder's limit on an admin metadata value (and key).
VALUE_LIMIT = 255
#: One key per node that may still hold an old copy of the volume, left
#: when a move away from it was abandoned as lost: ``<prefix><node>`` =
#: its LV.  Unlike LOSS_KEYS, which describe the latest abandon only, a
#: later abandon over another node leaves it; it stays until an operator
#: removes it (see Store.old_copies_of).
OLD_COPY_PREFIX = KEY_PREFIX + 'old_copy_'
#: The ACL a move's export gives its destination, recorded by the source
#: with the move (``<source node> <destination's initiator>``), apart
#: from the move's own keys: the destination clears an ``aborted`` move
#: without touching the source's export, and this key is then what
#: still tells the source that its export admits that node for a move
#: that is over (see Source.drop_leftover_export).  It goes with the
#: source's export (Store.forget_source_export).
EXPORT_KEY = KEY_PREFIX + 'move_export'
#: Written with a move (one of its keys, cleared with it) when
#: :data:`EXPORT_KEY` was written with it: a move without it was
#: recorded by an older release, which did not record that ACL.
EXPORT_RECORDED = 'export_recorded'
#: The one key per volume under which release 1.x marked a move thin
#: mapped (see THIN_MAPPED_PREFIX).  Still honoured on load when its
#: value is the move's tag (an upgrade during a move keeps the guard),
#: never written; one of the move's keys, cleared with it.
THIN_MAPPED = 'thin_mapped'
#: Written by a move's destination before the first discard of a thin
#: map into its clone (see Store.mark_thin_mapped): regions of that
#: clone read as copied only while the destination's thin pool zeroes
#: new blocks, so its hydration must be guarded
#: (Destination.guard_pool_zeroing), by every later start of the
#: destination's service too.  One key per move (:func:`thin_mapped_key`):
#: the mark's check and write are two calls without a lock, so a late
#: write or delete of a move given up must touch only its own key,
#: never a later move's.  Every key under the prefix goes when a move is
#: recorded or cleared.
THIN_MAPPED_PREFIX = KEY_PREFIX + THIN_MAPPED + '_'
#: what a move in ``cloned`` waits for before it may commit (operators
#: see them in the status tool; gone once it commits).
WAIT_KEYS = ('stale_source_attachment', 'awaiting_source')

_IQN_RE = re.compile(r'^iqn\.[0-9]{4}-[0-9]{2}\.[A-Za-z0-9.-]+(:[^\s]+)?$')
_PORTAL_RE = re.compile(r'^[0-9A-Za-z.:\[\]-]+:[0-9]{1,5}$')
_HOST_RE = re.compile(r'^[A-Za-z0-9_.@#:-]+$')
_SECRET_RE = re.compile(r'^[0-9a-f]{32,128}$')
#: Seconds past the source's transfer timeout after which a move still
#: ``preparing`` is taken for dead (see Side.prepare_outlived): the
#: source's database writes after the destination's answer, and the
#: time between the source's start and its call to the destination.
STALE_PREPARE_MARGIN = 120


class MoveStateInvalid(exception.VolumeBackendAPIException):
    message = _("Move state of volume %(volume_id)s is invalid "
                "(%(reason)s); nothing was changed. Fix or remove the "
                "dmclone_* admin metadata keys after checking both nodes.")


class MoveStateConflict(exception.VolumeBackendAPIException):
    message = _("The move of volume %(volume_id)s changed under this "
                "step (expected %(expected)s, found %(found)s); the step "
                "was not taken.")


class MoveDeadlinePassed(exception.VolumeBackendAPIException):
    message = _("The move of volume %(volume_id)s was not committed: the "
                "deadline its source recorded for it passed %(late)d s "
                "ago, after which either node may give it up; nothing was "
                "written.")


class MoveInProgress(exception.VolumeIsBusy):
    message = _("Volume %(volume_name)s is moving from %(source)s to "
                "%(dest)s (%(state)s, %(percent)s%% hydrated): %(action)s is "
                "possible once the move has finished.")


#: tooz backends whose locks hold on one node only.
NODE_LOCAL_COORDINATION = ('', 'file', 'ipc', 'zake')


def check_coordination(backend_url, shared_file_locks):
    """Refuse a coordination backend whose locks are per node.

    A move's steps on its two nodes, and the operator's commands, are
    serialised by the volume's coordination lock (:func:`lock`): with
    Cinder's default ``file://$state_path`` each node locks alone.
    ``file://`` on a file system every node shares is the one exception,
    which the operator states (``dmclone_shared_file_locks``).  Raises
    NodeLocalCoordination.
    """
    url = backend_url or ''
    scheme = urllib.parse.urlsplit(url).scheme.partition('+')[0].lower()
    if scheme == 'file' and shared_file_locks:
        return
    if scheme in NODE_LOCAL_COORDINATION:
        raise dmc_exception.NodeLocalCoordination(
            option='[coordination] backend_url', value=url)


def thin_map_tag(secret):
    """The value of :data:`THIN_MAPPED` for the move with ``secret``.

    Bound to that very move: a later move of the volume has another
    secret, so a mark that a clear cut short left behind never names it.
    A digest, so that the secret is not written twice.
    """
    return hashlib.sha256(('dmclone-thin-mapped:%s' % secret).encode(
        'utf-8')).hexdigest()[:32]


#: How a move into a node was ending there, as its end mark says
#: (Destination.mark_end): a finalization's swap to linear of its fully
#: hydrated clone, or a rollback's teardown.
END_SWAP = 'swap'
END_ROLLBACK = 'rollback'


def end_tag(secret, how):
    """The value of the end mark of the move with ``secret``, ending ``how``.

    (:data:`END_SWAP` or :data:`END_ROLLBACK`.)  Bound to that very move
    and that end, as :func:`thin_map_tag` is.
    """
    if how not in (END_SWAP, END_ROLLBACK):
        raise ValueError('a move ends by %s or %s, not %s'
                         % (END_SWAP, END_ROLLBACK, how))
    return hashlib.sha256(('dmclone-end-%s:%s' % (how, secret)).encode(
        'utf-8')).hexdigest()[:32]


def thin_mapped_key(secret):
    """The admin metadata key of the move with ``secret``'s mark.

    Named by that move's tag (:func:`thin_map_tag`, well under Cinder's
    255 characters), so no other move reads, writes or deletes it.
    """
    return THIN_MAPPED_PREFIX + thin_map_tag(secret)


def thin_mapped_keys(metadata):
    """Every thin-mapped mark in ``metadata``: per move, and the old key."""
    return sorted(k for k in (metadata or {})
                  if k.startswith(THIN_MAPPED_PREFIX)
                  or k == KEY_PREFIX + THIN_MAPPED)


def old_copy_key(node):
    """The admin metadata key naming ``node``'s old copy (OLD_COPY_PREFIX)."""
    return OLD_COPY_PREFIX + node


def lock(volume_id):
    """The per-volume lock every step of a move runs under."""
    return coordination.COORDINATOR.get_lock('dmclone-%s' % volume_id)


@contextlib.contextmanager
def _lock_taken(volume_id, blocking, level):
    """The volume's lock if it can be taken: yields True, else False.

    An error of the coordination backend (down, or refusing the lock)
    yields False too, logged at ``level``.
    """
    try:
        lk = lock(volume_id)
        acquired = bool(lk.acquire(blocking=blocking))
    except Exception as exc:
        LOG.log(level, 'The lock of volume %(vol)s could not be taken (is '
                'the coordination backend down?): %(exc)s',
                {'vol': volume_id, 'exc': exc})
        acquired = False
    try:
        yield acquired
    finally:
        if acquired:
            lk.release()


def lock_if_free(volume_id):
    """The volume's lock if nobody holds it now: yields True, else False.

    For the monitor's routine writes, which must never wait: a step that
    holds the lock may wait for a peer up to the transfer timeout, and
    the monitor's tick serves every clone of the node in turn.  False
    too when the coordination backend does not answer (the caller's
    work that needs no lock goes on).
    """
    return _lock_taken(volume_id, False, logging.DEBUG)


def lock_unless_down(volume_id):
    """The volume's lock, waited for: yields True; False if it is down.

    For startup recovery, which must not depend on the coordination
    backend (etcd, Redis...) being up: the volume's lock is waited for as
    :func:`lock` does, but a backend that does not answer (or refuses the
    lock) yields False instead of raising, and the caller leaves the
    step for the monitor to take again once it answers
    (:meth:`cinder_dmclone.recovery.Recovery.retry_abandons`).
    """
    return _lock_taken(volume_id, True, logging.WARNING)


def build_lock(volume_id):
    """This node's lock on building or removing a volume's clone.

    The destination builds a clone inside the source's critical section
    (it holds the volume lock while it waits), and a source that gave up
    waiting asks it to abort in the same way: the two steps may then run
    at once in this service.  This process-local lock makes the abort wait
    for the build, so it removes everything the build made.
    """
    return lockutils.lock('dmclone-build-%s' % volume_id)


def handle_lock(volume_id):
    """This node's lock on mapping a volume's handle to serve it.

    A revert removes the handle, checks that nothing holds the LV open
    and merges; a request serving the volume from here (a local attach,
    an export, an image copy) must not map the handle in between
    (``DMCloneVolumeDriver.revert_to_snapshot``).  Both run in this
    volume's service on this node, so a process-local lock suffices, and
    a local attach keeps working while the coordination backend is down.
    """
    return lockutils.lock('dmclone-handle-%s' % volume_id)


#: The running kernel's identity: it changes with every boot.
BOOT_ID_PATH = '/proc/sys/kernel/random/boot_id'


@functools.lru_cache(maxsize=1)
def kernel_id():
    """This kernel's boot id (a process never outlives its kernel)."""
    with open(BOOT_ID_PATH) as f:
        return f.read().strip()


def pool_lock(vg_name, pool):
    """The lock on thin pool ``vg_name/pool``'s metadata snapshot.

    A pool holds one metadata snapshot at a time, and whatever reads
    one (this node's moves, its start's release of leftovers, the
    operator's ``abandon-source``) reads it in turn
    (:mod:`cinder_dmclone.region_map`).  The pool is an object of the
    kernel that runs it, so the coordination lock is named after that
    kernel (its boot id), not after a node: two volume services sharing
    a volume group under two node names (review 32) must exclude each
    other, while the like-named pools of other nodes (every node's
    ``cinder-volumes``) must not.
    """
    return coordination.COORDINATOR.get_lock(
        'dmclone-metasnap-%s-%s-%s' % (kernel_id(), vg_name, pool))


def space_lock(vg_name):
    """This node's lock on checking and taking a volume group's space.

    A move into this node checks that its LVs fit (counting the LVs of
    the other moves into it), then creates them; each prepare holds only
    its own volume's locks, so two moves into one node would otherwise
    both be checked against the same free space.  Held from the check to
    the creation of the LVs, not for the login and clone build after.
    """
    return lockutils.lock('dmclone-space-%s' % vg_name)


def _int(value, volume_id, name, minimum=1):
    try:
        result = int(value)
    except (TypeError, ValueError):
        raise MoveStateInvalid(volume_id=volume_id,
                               reason='%s=%r is not an integer'
                               % (name, value)) from None
    if result < minimum:
        raise MoveStateInvalid(volume_id=volume_id,
                               reason='%s=%d is below %d'
                               % (name, result, minimum))
    return result


def _match(regex, value, volume_id, name):
    # fullmatch: '$' alone would accept a trailing newline.
    if not isinstance(value, str) or not regex.fullmatch(value):
        raise MoveStateInvalid(volume_id=volume_id,
                               reason='%s=%r is malformed'
                               % (name, value))
    return value


@dataclasses.dataclass
class Move:
    """The persisted description of one move."""

    volume_id: str
    lv_name: str
    state: str
    #: Cinder volume host strings (host@backend#pool) of both ends.
    source_host: str
    dest_host: str
    #: Node names as connectors spell them.
    source_node: str
    dest_node: str
    #: dm-clone region size, and length of the clone segment, in sectors;
    #: a rebuilt table must use exactly these values.
    region_sectors: int
    clone_sectors: int
    #: The source's iSCSI export of the volume.
    target_portal: str
    target_iqn: str
    target_lun: int = 0
    #: Other names of the source node (its dmclone_node_aliases): an
    #: attachment or a detach made under one of them is the source's.
    source_aliases: tuple = ()
    #: A random value only the two volume services know (admin metadata
    #: is never shown to a volume's owner): every node-to-node step
    #: carries it, so none can be forged through the public API.
    secret: str = ''
    #: When the source recorded the move (seconds since the epoch, its
    #: clock); None in a record written by an older release.
    prepared_at: typing.Optional[int] = None
    #: When the source's attempt is over for sure (its clock, too): the
    #: start plus the source's own transfer timeout and a margin.  Only
    #: its difference from ``prepared_at`` (a duration) means anything
    #: to another node.  None in a record written by an older release.
    prepare_deadline: typing.Optional[int] = None
    #: The destination marked regions of this move's clone copied
    #: without a copy (a thin map), or was about to: its hydration is
    #: guarded (see :data:`THIN_MAPPED`).  Never written by the source's
    #: record of the move (:meth:`to_metadata`): only by
    #: Store.mark_thin_mapped.
    thin_mapped: bool = False

    FIELDS = ('lv_name', 'state', 'source_host', 'dest_host', 'source_node',
              'dest_node', 'region_sectors', 'clone_sectors',
              'target_portal', 'target_iqn', 'target_lun')
    #: Fields a record written by release 1.1.0 does not have.
    OPTIONAL_FIELDS = ('source_aliases', 'secret', 'prepared_at',
                       'prepare_deadline')

    @property
    def source_names(self):
        """Every name the source node attaches and detaches under."""
        return {self.source_node} | set(self.source_aliases)

    def to_metadata(self):
        """Admin metadata entries (strings) describing the t."""
        md = {KEY_PREFIX + name: str(getattr(self, name))
              for name in self.FIELDS}
        md[KEY_PREFIX + 'source_aliases'] = ','.join(
            sorted(self.source_aliases))
        md[KEY_PREFIX + 'secret'] = self.secret
        for name in ('prepared_at', 'prepare_deadline'):
            if getattr(self, name) is not None:
                md[KEY_PREFIX + name] = str(getattr(self, name))
        return md

    @property
    def prepare_budget(self):
        """Seconds the source's attempt may last, as it recorded; or None.

        A duration, which every node may measure on its own clock.
        """
        if self.prepared_at is None or self.prepare_deadline is None:
            return None
        return self.prepare_deadline - self.prepared_at

    def same_move(self, other):
        """True if ``other`` is this very move, not a later one."""
        return (other is not None and bool(self.secret)
                and hmac.compare_digest(self.secret, other.secret or '')
                and self.dest_node == other.dest_node)

    def still(self, other):
        """True if ``other``, read later, still records this move.

        :meth:`same_move`; a move recorded by release 1.1.0 has no secret
        yet when read (it gets one at its next step), so for it the same
        destination is taken as the same move.
        """
        if self.secret:
            return self.same_move(other)
        return other is not None and other.dest_node == self.dest_node

    def authentic(self, secret):
        """True if ``secret`` is this move's (constant-time compare)."""
        return (bool(self.secret) and isinstance(secret, str)
                and hmac.compare_digest(self.secret.encode(),
                                        secret.encode()))

    @classmethod
    def from_metadata(cls, volume_id, metadata):
        """The move in ``metadata``, None if there is none.

        Every value is validated: state written by hand or by a broken
        release raises MoveStateInvalid instead of driving commands.
        """
        metadata = metadata or {}
        if KEY_PREFIX + 'state' not in metadata:
            return None
        raw = {}
        for name in cls.FIELDS:
            if KEY_PREFIX + name not in metadata:
                raise MoveStateInvalid(volume_id=volume_id,
                                       reason='%s%s is missing'
                                       % (KEY_PREFIX, name))
            raw[name] = metadata[KEY_PREFIX + name]
        if raw['state'] not in STATES:
            raise MoveStateInvalid(volume_id=volume_id,
                                   reason='unknown state %r'
                                   % raw['state'])
        try:
            layout.validate_lv_name(raw['lv_name'])
            region = dmsetup.validate_region_size(
                _int(raw['region_sectors'], volume_id, 'region_sectors'))
        except (dmc_exception.InvalidDMName,
                dmc_exception.InvalidTable) as exc:
            raise MoveStateInvalid(volume_id=volume_id,
                                   reason=str(exc)) from None
        for name in ('source_host', 'dest_host', 'source_node', 'dest_node'):
            _match(_HOST_RE, raw[name], volume_id, name)
        if raw['source_host'] == raw['dest_host']:
            raise MoveStateInvalid(volume_id=volume_id,
                                   reason='source and destination are '
                                          'the same host')
        aliases = metadata.get(KEY_PREFIX + 'source_aliases') or ''
        aliases = tuple(_match(_HOST_RE, name, volume_id, 'source_aliases')
                        for name in aliases.split(',') if name)
        secret = metadata.get(KEY_PREFIX + 'secret') or ''
        if secret:
            _match(_SECRET_RE, secret, volume_id, 'secret')
        times = {}
        for name in ('prepared_at', 'prepare_deadline'):
            value = metadata.get(KEY_PREFIX + name) or None
            times[name] = None if value is None else _int(
                value, volume_id, name, minimum=0)
        if None not in times.values() and \
                times['prepare_deadline'] < times['prepared_at']:
            raise MoveStateInvalid(volume_id=volume_id,
                                   reason='prepare_deadline is before '
                                          'prepared_at')
        return cls(
            volume_id=volume_id, lv_name=raw['lv_name'], state=raw['state'],
            source_host=raw['source_host'], dest_host=raw['dest_host'],
            source_node=raw['source_node'], dest_node=raw['dest_node'],
            region_sectors=region,
            clone_sectors=_int(raw['clone_sectors'], volume_id,
                               'clone_sectors'),
            target_portal=_match(_PORTAL_RE, raw['target_portal'],
                                 volume_id, 'target_portal'),
            target_iqn=_match(_IQN_RE, raw['target_iqn'], volume_id,
                              'target_iqn'),
            target_lun=_int(raw['target_lun'], volume_id, 'target_lun',
                            minimum=0),
            source_aliases=aliases, secret=secret,
            thin_mapped=cls._thin_mapped(metadata, secret), **times)

    @staticmethod
    def _thin_mapped(metadata, secret):
        """True if ``metadata`` marks the move with ``secret`` mapped.

        Under this move's key (:func:`thin_mapped_key`), or under the
        single key of the previous release (:data:`THIN_MAPPED`), with
        this move's tag as the value.  A mark of another move (a late
        write of a move given up, a clear cut short) is inert, as is any
        other value: never an error.
        """
        if not secret:
            return False
        tag = thin_map_tag(secret).encode('utf-8')
        for key in (thin_mapped_key(secret), KEY_PREFIX + THIN_MAPPED):
            value = metadata.get(key)
            if isinstance(value, str) and hmac.compare_digest(
                    value.encode('utf-8'), tag):
                return True
        return False

    @classmethod
    def metadata_keys(cls):
        return [KEY_PREFIX + n
                for n in cls.FIELDS + cls.OPTIONAL_FIELDS + PROGRESS_KEYS
                + (EXPORT_RECORDED, THIN_MAPPED)]

    def source_properties(self, provider_auth=None):
        """os-brick iSCSI connection properties of the source export.

        The one portal is also given as the lists os-brick's multipath
        form uses: with them, a disconnect takes the targets from these
        properties instead of querying iscsiadm's discovery database.
        That query fails on a node with no iSCSI records yet, and the
        clean-up before a build then logged an ERROR with a traceback
        ("Exception encountered during portal discovery").
        """
        props = {'target_portal': self.target_portal,
                 'target_iqn': self.target_iqn,
                 'target_lun': self.target_lun,
                 'target_portals': [self.target_portal],
                 'target_iqns': [self.target_iqn],
                 'target_luns': [self.target_lun],
                 'target_discovered': False,
                 'volume_id': self.volume_id}
        if provider_auth:
            method, user, secret = provider_auth.split(' ', 2)
            props.update(auth_method=method, auth_username=user,
                         auth_password=secret)
        return props


def progress_percent(metadata):
    return (metadata or {}).get(KEY_PREFIX + 'percent', '0.0')


class Store(object):
    """Move records in the volume's admin metadata.

    Admin metadata is visible to every service of the deployment (and to
    admins, never to the volume's owner), which is what lets any node tell
    where a volume is in its move.

    This is the only code that writes a move's state.  Every writer
    holds the volume's lock (see :func:`lock`), and
    every change of state is conditional: :meth:`transition` re-reads the
    record and changes it only if it is still the same move in one of the
    states the step expects, so a step that lost a race changes nothing.
    """

    def __init__(self, db, clock=time.time):
        self.db = db
        #: wall clock (seconds since the epoch): a move's start is read
        #: on the other node too.
        self._clock = clock

    def load(self, ctxt, volume_id):
        md = self.db.volume_admin_metadata_get(ctxt, volume_id)
        return Move.from_metadata(volume_id, md)

    @staticmethod
    def new_secret():
        return secrets.token_hex(SECRET_BYTES)

    def percent(self, ctxt, volume_id):
        """The hydration percentage last published for the volume."""
        return progress_percent(
            self.db.volume_admin_metadata_get(ctxt, volume_id))

    def save(self, ctxt, t, budget=None, initiator=None):
        """Record a new move (with a fresh secret if it has none).

        The move's start time goes with it (see :meth:`prepare_age`), and
        with ``budget``, the seconds the recording attempt may last (the
        source's transfer timeout and a margin), its deadline.  With
        ``initiator`` (the destination's, which the source's export now
        admits), :data:`EXPORT_KEY` in the same write.
        Progress and every thin map's mark left by an earlier move (a
        clear that a crash cut short, a late mark of a move given up) go
        first: they must never be taken for this move's (a mark is bound
        to its move's secret anyway), nor stay for ever.
        """
        if not t.secret:
            t.secret = self.new_secret()
        t.prepared_at = int(self._clock())
        t.prepare_deadline = (None if budget is None
                              else t.prepared_at + int(budget))
        t.thin_mapped = False
        md = self.db.volume_admin_metadata_get(ctxt, t.volume_id)
        self._delete(ctxt, t.volume_id,
                     [KEY_PREFIX + k for k in PROGRESS_KEYS]
                     + thin_mapped_keys(md))
        md = t.to_metadata()
        if initiator:
            value = '%s %s' % (t.source_node, initiator.lower())
            if len(value) <= VALUE_LIMIT:
                md[EXPORT_KEY] = value
                md[KEY_PREFIX + EXPORT_RECORDED] = 'True'
            else:
                LOG.warning('Volume %s: the ACL its move\'s export gives '
                            'is not recorded (%d characters): should the '
                            'move end while this node cannot reach the '
                            'database, check that export by hand.',
                            t.volume_id, len(value))
        self.db.volume_admin_metadata_update(ctxt, t.volume_id, md, False)

    @staticmethod
    def move_export_of(metadata):
        """``(source node, initiator)`` of :data:`EXPORT_KEY`, or None."""
        value = (metadata or {}).get(EXPORT_KEY) or ''
        node, _sep, initiator = value.partition(' ')
        if not (node and initiator):
            return None
        return node, initiator

    def move_export(self, ctxt, volume_id):
        """The recorded ACL of a move's export (:meth:`move_export_of`)."""
        return self.move_export_of(
            self.db.volume_admin_metadata_get(ctxt, volume_id))

    def export_recorded(self, ctxt, volume_id):
        """True if the move recorded now recorded its export's ACL."""
        md = self.db.volume_admin_metadata_get(ctxt, volume_id) or {}
        return KEY_PREFIX + EXPORT_RECORDED in md

    def forget_move_export(self, ctxt, volume_id):
        """The ACL of :data:`EXPORT_KEY` is gone: forget it."""
        self._delete(ctxt, volume_id, [EXPORT_KEY])

    def prepare_age(self, t):
        """Seconds since move ``t`` was recorded; None if not recorded.

        On this node's clock: meaningful only on the node that recorded
        it (the source).
        """
        if t.prepared_at is None:
            return None
        return self._clock() - t.prepared_at

    def _delete(self, ctxt, volume_id, keys):
        md = self.db.volume_admin_metadata_get(ctxt, volume_id) or {}
        for key in keys:
            if key not in md:
                continue
            try:
                self.db.volume_admin_metadata_delete(ctxt, volume_id, key)
            except exception.CinderException:
                pass

    def ensure_secret(self, ctxt, t):
        """Give a move recorded by release 1.1.0 its secret (under lock).

        Steps are only ever sent by the node holding the volume's lock,
        which calls this first: the other node then reads the secret from
        the record like any other field.
        """
        if t.secret:
            return
        t.secret = self.new_secret()
        self.db.volume_admin_metadata_update(
            ctxt, t.volume_id,
            {KEY_PREFIX + 'secret': t.secret}, False)

    def transition(self, ctxt, t, expected, state):
        """Move ``t`` from one of ``expected`` states to ``state``.

        Raises MoveStateConflict, writing nothing, if the record no
        longer describes this move (cleared, replaced by another move) or
        is in a state the step does not expect; MoveDeadlinePassed,
        writing nothing, for a commit of a ``preparing`` move once the
        deadline its source recorded has passed
        (:meth:`_refuse_past_deadline`).
        """
        current = self._current(ctxt, t, expected)
        if current.state == PREPARING and state in (CLONED, HYDRATING):
            self._refuse_past_deadline(current)
        self._write_state(ctxt, t, state)

    def roll_forward(self, ctxt, t, state):
        """Set move ``t``, rewound to ``preparing``, back to ``state``.

        Not a commit: the source committed the move, and pointed the
        volume record at its destination afterwards; a whole save of an
        older copy of the admin metadata then set the state back (see
        Destination.roll_forward, which alone calls this, and decides
        ``state``: ``cloned`` or ``hydrating``, ``finalizing`` for a
        clone it swapped to linear already; ``cloned`` also for a
        rollback cut short after its teardown there, which it then
        finishes).  So the source's
        deadline (:meth:`_refuse_past_deadline`) does not apply: it
        keeps a late commit from naming a clone that either node may be
        removing as dead, and neither removes one whose volume record
        names its destination.  Conditional like :meth:`transition`:
        MoveStateConflict, writing nothing, unless the record still
        describes this very move, ``preparing``.
        """
        if state not in (CLONED, HYDRATING, FINALIZING):
            raise ValueError('a rewound move goes back to %s, %s or %s, '
                             'not %s' % (CLONED, HYDRATING, FINALIZING,
                                         state))
        self._current(ctxt, t, (PREPARING,))
        self._write_state(ctxt, t, state)

    def restore(self, ctxt, stale, t, export=None):
        """Write move ``t``, ``preparing``, over record ``stale``.

        For the destination of ``t`` only (Destination.restore_record),
        under the volume's lock: a stale whole save of the admin metadata
        replaced ``t``'s record by ``stale`` (an earlier move's, or none),
        and this node's own mark kept ``t``'s.  It is written back as a
        committed move set back to ``preparing`` (R14-4), which the
        destination then rolls forward as its clone tells
        (Destination.roll_forward).  ``export``: the ACL its export gave
        (:data:`EXPORT_KEY`), as its source recorded it.  Conditional:
        MoveStateConflict, writing nothing, unless the record still is
        ``stale`` (the same move in the same state; none if None).  Keys
        ``stale`` had that ``t`` has not (progress, what it waited for,
        the times of an older release's record) go after the write.
        """
        current = self.load(ctxt, t.volume_id)
        if not self._same_record(stale, current):
            raise MoveStateConflict(
                volume_id=t.volume_id,
                expected='none' if stale is None else stale.state,
                found='none' if current is None else 'another record')
        md = dict(t.to_metadata(), **{KEY_PREFIX + 'state': PREPARING})
        if export:
            md[EXPORT_KEY] = export
            md[KEY_PREFIX + EXPORT_RECORDED] = 'True'
        self.db.volume_admin_metadata_update(ctxt, t.volume_id, md, False)
        t.state = PREPARING
        self._delete(ctxt, t.volume_id, [
            key for key in Move.metadata_keys() + [EXPORT_KEY]
            if key not in md])

    @staticmethod
    def _same_record(stale, current):
        """True if ``current`` is record ``stale`` still (both may be None)."""
        if stale is None or current is None:
            return stale is None and current is None
        if stale.secret:
            return stale.same_move(current) and current.state == stale.state
        return current.to_metadata() == stale.to_metadata()

    def _current(self, ctxt, t, expected):
        """The record of move ``t`` if in one of ``expected`` states.

        MoveStateConflict if it describes no move, another move, or this
        one in another state.  A move recorded by release 1.1.0 gets its
        secret here first (the caller holds the lock, as every writer
        does).
        """
        self.ensure_secret(ctxt, t)
        current = self.load(ctxt, t.volume_id)
        if current is None or not t.same_move(current):
            found = 'none' if current is None else 'another move'
        elif current.state not in expected:
            found = current.state
        else:
            return current
        raise MoveStateConflict(volume_id=t.volume_id,
                                expected='/'.join(expected), found=found)

    def _write_state(self, ctxt, t, state):
        self.db.volume_admin_metadata_update(
            ctxt, t.volume_id, {KEY_PREFIX + 'state': state}, False)
        t.state = state

    def _refuse_past_deadline(self, t):
        """Refuse to commit prepared move ``t`` once its deadline passed.

        Only the source commits a prepared move, on the clock that
        recorded its deadline (:meth:`save`).  From the deadline on,
        either node takes the move for dead
        (:meth:`~cinder_dmclone.side.Side.prepare_outlived`) and may be
        giving it up or removing its clone right now (the lock does not
        exclude them with per-node locks or a lost lease): a commit would
        then name a clone that may be gone.  Checked after the record is
        read again, right before the write.  A move recorded by an older
        release has no deadline to check.
        """
        if t.prepare_deadline is None:
            return
        late = self._clock() - t.prepare_deadline
        if late >= 0:
            LOG.error('Not committing the move of volume %(vol)s to '
                      '%(dst)s: its deadline passed %(late)d s ago.',
                      {'vol': t.volume_id, 'dst': t.dest_node,
                       'late': late})
            raise MoveDeadlinePassed(volume_id=t.volume_id, late=late)

    def mark_thin_mapped(self, ctxt, t):
        """Record that move ``t``'s clone is about to be thin mapped.

        Its destination calls this before the first discard of the map
        (each marks regions copied that only the pool's zeroing keeps
        reading zeroes), so that no crash can leave a mapped clone that
        the record does not name: every later start of the destination
        guards its hydration (Destination.guard_pool_zeroing).  A mark
        whose discards never ran is harmless: it only stops that clone's
        hydration while the pool does not zero.  Written inside the
        source's critical section (it holds the volume's lock while it
        waits for the prepare), and only while the record still
        describes this move, ``preparing``: MoveStateConflict, writing
        nothing, otherwise (a source that gave up meanwhile).
        """
        current = self.load(ctxt, t.volume_id)
        if current is None:
            found = 'none'
        elif not t.same_move(current):
            found = 'another move'
        else:
            found = None if current.state == PREPARING else current.state
        if found is not None:
            raise MoveStateConflict(volume_id=t.volume_id,
                                    expected=PREPARING, found=found)
        # Under this move's own key: should this write land late, after
        # the move was given up and a later one marked, it names only
        # this move, and the next save or clear removes it.
        self.db.volume_admin_metadata_update(
            ctxt, t.volume_id,
            {thin_mapped_key(t.secret): thin_map_tag(t.secret)}, False)
        t.thin_mapped = True

    def forget_thin_map(self, ctxt, t):
        """No region of move ``t``'s clone was marked copied after all.

        (Its clone was open, or the source needed every region: nothing
        was discarded.)  Only ``t``'s own key goes: a later move's mark
        is never touched, however late this runs.
        """
        if t.secret:
            self._delete(ctxt, t.volume_id, [thin_mapped_key(t.secret)])
        t.thin_mapped = False

    def mark_stale_source_attachment(self, ctxt, t):
        """Say, for the status tool, that the move waits for an operator.

        (See Destination.hold; gone at the commit.)
        """
        self._mark_wait(ctxt, t, 'stale_source_attachment')

    def mark_awaiting_source(self, ctxt, t):
        """Say, for the status tool, that the source has not confirmed.

        (See Destination.commit_once_closed; gone at the commit.)
        """
        self._mark_wait(ctxt, t, 'awaiting_source')

    def _mark_wait(self, ctxt, t, key):
        """Record one of WAIT_KEYS for move ``t``, naming its source."""
        self.db.volume_admin_metadata_update(
            ctxt, t.volume_id, {KEY_PREFIX + key: t.source_node}, False)

    def clear_waits(self, ctxt, volume_id):
        """The move committed: it waits for nothing any more."""
        self._delete(ctxt, volume_id, [KEY_PREFIX + k for k in WAIT_KEYS])

    def publish_progress(self, ctxt, volume_id, progress):
        self.db.volume_admin_metadata_update(
            ctxt, volume_id,
            {KEY_PREFIX + k: v for k, v in progress.as_dict().items()},
            False)

    def record_loss(self, ctxt, volume_id, loss):
        """Record what a move over a lost source could not copy.

        ``loss`` maps :data:`LOSS_KEYS` (without the prefix) to strings
        of at most :data:`VALUE_LIMIT` characters.  Written under the
        volume's lock by the move's end (:mod:`cinder_dmclone.lost_source`)
        and kept after the move is cleared.  The lost node's old copy is
        also recorded under its own key (:func:`old_copy_key`), which a
        later abandon over another node leaves in place.
        """
        unknown = set(loss) - set(LOSS_KEYS)
        long_values = [k for k, v in loss.items()
                       if len(str(v)) > VALUE_LIMIT]
        if unknown or long_values:
            raise ValueError('bad loss record: unknown %s, too long %s'
                             % (sorted(unknown), sorted(long_values)))
        values = {KEY_PREFIX + k: str(v) for k, v in loss.items()}
        node, lv = loss.get('lost_source'), loss.get('lost_source_lv')
        if node and lv:
            if len(old_copy_key(node)) <= VALUE_LIMIT:
                values[old_copy_key(node)] = str(lv)
            else:
                LOG.warning('Node name %s is too long for a key of its '
                            'own: only the latest loss record names its '
                            'old copy.', node)
        self.db.volume_admin_metadata_update(ctxt, volume_id, values, False)

    def record_old_copy(self, ctxt, volume_id, node, lv):
        """Record that ``node`` keeps ``lv``, an old copy of the volume.

        Under the key an abandon as lost also writes (:func:`old_copy_key`):
        the start's report, the status tool and the destination's
        teardown (Destination.tear_down) know it so.  Written before the
        volume record stops naming ``node`` (see
        Destination.roll_back_without_metadata).
        """
        if len(old_copy_key(node)) > VALUE_LIMIT:
            raise ValueError('node name %s too long for a key' % node)
        self.db.volume_admin_metadata_update(
            ctxt, volume_id, {old_copy_key(node): str(lv)}, False)

    def old_copies(self, ctxt, volume_id):
        """{node: LV} of the old copies recorded (see old_copies_of)."""
        return self.old_copies_of(self.db.volume_admin_metadata_get(
            ctxt, volume_id))

    def loss(self, ctxt, volume_id):
        """The loss recorded for ``volume_id`` (see :meth:`loss_of`)."""
        return self.loss_of(self.db.volume_admin_metadata_get(ctxt,
                                                              volume_id))

    @staticmethod
    def loss_of(metadata):
        """The loss recorded in admin ``metadata``: {key: value}, or {}."""
        metadata = metadata or {}
        return {k: metadata[KEY_PREFIX + k] for k in LOSS_KEYS
                if KEY_PREFIX + k in metadata}

    @staticmethod
    def old_copies_of(metadata):
        """{node: LV} of every node the record says holds an old copy.

        Each abandon as lost names its lost node's old copy under a key
        of its own (:func:`old_copy_key`), and the latest also in
        ``dmclone_lost_source``/``dmclone_lost_source_lv`` (the only
        place a record written by an earlier release names it).  Whether
        the LV is still there, only that node's LVM tells.
        """
        metadata = metadata or {}
        copies = {key[len(OLD_COPY_PREFIX):]: value
                  for key, value in metadata.items()
                  if key.startswith(OLD_COPY_PREFIX) and value
                  and len(key) > len(OLD_COPY_PREFIX)}
        node = metadata.get(KEY_PREFIX + 'lost_source')
        lv = metadata.get(KEY_PREFIX + 'lost_source_lv')
        if node and lv:
            copies.setdefault(node, lv)
        return copies

    def clear(self, ctxt, volume_id, t=None):
        """Forget the move; with ``t``, only if it is still that one.

        A step that ends a move passes it, so that a later move of the
        same volume recorded meanwhile is never erased.
        """
        if t is not None and t.secret:
            current = self.load(ctxt, volume_id)
            if current is not None and not t.same_move(current):
                LOG.warning('Not clearing the move of volume %s: the '
                            'record describes another move now.', volume_id)
                return
        # The state key goes first: without it the other keys are inert,
        # so a crash part-way leaves no half-described move behind.  The
        # marks of every move (its own, late ones of moves given up) go
        # last, read once the state is gone.
        state = KEY_PREFIX + 'state'
        keys = [state] + [k for k in Move.metadata_keys() if k != state]
        self._delete_each(ctxt, volume_id, keys)
        self._delete_each(ctxt, volume_id, [
            k for k in self._marks(ctxt, volume_id) if k not in keys])

    def _delete_each(self, ctxt, volume_id, keys):
        """Delete ``keys`` unread, ignoring Cinder's errors (see clear)."""
        for key in keys:
            try:
                self.db.volume_admin_metadata_delete(ctxt, volume_id, key)
            except exception.CinderException:
                pass

    def _marks(self, ctxt, volume_id):
        """The thin-mapped marks' keys in the record ([] if unreadable).

        A clear ignores Cinder's errors (a volume deleted meanwhile has
        no record left to clear), so this read does too.
        """
        try:
            return thin_mapped_keys(
                self.db.volume_admin_metadata_get(ctxt, volume_id))
        except exception.CinderException:
            return []

    def forget_source_export(self, ctxt, volume_id):
        """The source's export is gone: the record stops naming it.

        The ACL a move's export gave (:data:`EXPORT_KEY`) went with it.
        """
        self.db.volume_update(ctxt, volume_id, {'provider_location': None,
                                                'provider_auth': None})
        self.forget_move_export(ctxt, volume_id)

    def move_volume(self, ctxt, volume_id, host, availability_zone=None):
        """Point the volume record at the node that now holds it."""
        values = {'host': host}
        if availability_zone:
            values['availability_zone'] = availability_zone
        self.db.volume_update(ctxt, volume_id, values)
