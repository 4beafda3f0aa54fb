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

"""A volume moving from one node to another, as explicit persisted steps.

A transfer moves a volume from its *source* node (where its LV is) to a
*destination* node (where an instance attaches it).  Its state lives in the
volume's admin metadata (keys ``dmclone_*``), so every service can tell
where a volume is in its move, and each step below is idempotent, so a
service that crashed anywhere resumes by running the next step again:

=============  ===========================================================
state          meaning, and what recovery on the destination does
=============  ===========================================================
``preparing``  the source asked the destination to build the clone; it
               may be half built.  Recovery rolls the destination back
               (never reuses a metadata LV that may not be initialised).
``cloned``     the clone serves I/O on the destination, hydration is off
               because the source may still have an attachment (live
               migration).  Recovery rebuilds the clone, hydration off.
``hydrating``  the move is committed; the clone copies in the background.
               Recovery rebuilds the clone with hydration on.
``finalizing`` hydration finished; the handle is (being) swapped to a
               linear table and the source cleaned up.  Recovery runs
               the finalisation again.
``aborted``    the source gave the move up while the destination could
               not be reached to drop its side (it died mid-prepare, or
               never answered).  The volume stays, usable, on the
               source; nothing treats it as moving.  The destination's
               recovery (or its monitor) removes what it built and
               clears the state; the source's restart asks it again.
=============  ===========================================================

This module knows transfers and the node it runs on (device-mapper, LVM,
the iSCSI initiator); it never calls back up into the driver.
"""

import dataclasses
import hmac
import re
import secrets

from oslo_log import log as logging
from oslo_utils import units

from cinder import exception
from cinder.i18n import _

from cinder_dmclone import dmsetup
from cinder_dmclone import exception as dmc_exception
from cinder_dmclone import layout
from cinder_dmclone import privileged

LOG = logging.getLogger(__name__)

PREPARING = 'preparing'
CLONED = 'cloned'
HYDRATING = 'hydrating'
FINALIZING = 'finalizing'
ABORTED = 'aborted'
STATES = (PREPARING, CLONED, HYDRATING, FINALIZING, ABORTED)

KEY_PREFIX = 'dmclone_'
#: bytes of randomness in a transfer's secret (hex encoded in the record).
SECRET_BYTES = 16
PROGRESS_KEYS = ('hydrated_regions', 'total_regions', 'percent', 'rate_bps',
                 'eta_seconds', 'stalled_seconds', 'stale_source_attachment')

_IQN_RE = re.compile(r'^iqn\.[0-9]{4}-[0-9]{2}\.[A-Za-z0-9.-]+(:[^\s]+)?$')
_PORTAL_RE = re.compile(r'^[0-9A-Za-z.:\[\]-]+:[0-9]{1,5}$')
_HOST_RE = re.compile(r'^[A-Za-z0-9_.@#:-]+$')
_SECRET_RE = re.compile(r'^[0-9a-f]{32,128}$')


class TransferStateInvalid(exception.VolumeBackendAPIException):
    message = _("Transfer state of volume %(volume_id)s is invalid "
                "(%(reason)s); nothing was changed. Fix or remove the "
                "dmclone_* admin metadata keys after checking both nodes.")


class TransferStateConflict(exception.VolumeBackendAPIException):
    message = _("The transfer of volume %(volume_id)s changed under this "
                "step (expected %(expected)s, found %(found)s); the step "
                "was not taken.")


class TransferInProgress(exception.VolumeIsBusy):
    message = _("Volume %(volume_name)s is moving from %(source)s to "
                "%(dest)s (%(state)s, %(percent)s%% hydrated): %(action)s is "
                "possible once the transfer has finished.")


def _int(value, volume_id, name, minimum=1):
    try:
        result = int(value)
    except (TypeError, ValueError):
        raise TransferStateInvalid(volume_id=volume_id,
                                   reason='%s=%r is not an integer'
                                   % (name, value)) from None
    if result < minimum:
        raise TransferStateInvalid(volume_id=volume_id,
                                   reason='%s=%d is below %d'
                                   % (name, result, minimum))
    return result


def _match(regex, value, volume_id, name):
    # fullmatch: '$' alone would accept a trailing newline.
    if not isinstance(value, str) or not regex.fullmatch(value):
        raise TransferStateInvalid(volume_id=volume_id,
                                   reason='%s=%r is malformed'
                                   % (name, value))
    return value


@dataclasses.dataclass
class Transfer:
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

    FIELDS = ('lv_name', 'state', 'source_host', 'dest_host', 'source_node',
              'dest_node', 'region_sectors', 'clone_sectors',
              'target_portal', 'target_iqn', 'target_lun')
    #: Fields a record written by release 1.1.0 does not have.
    OPTIONAL_FIELDS = ('source_aliases', 'secret')

    @property
    def source_names(self):
        """Every name the source node attaches and detaches under."""
        return {self.source_node} | set(self.source_aliases)

    def to_metadata(self):
        """Admin metadata entries (strings) describing the transfer."""
        md = {KEY_PREFIX + name: str(getattr(self, name))
              for name in self.FIELDS}
        md[KEY_PREFIX + 'source_aliases'] = ','.join(
            sorted(self.source_aliases))
        md[KEY_PREFIX + 'secret'] = self.secret
        return md

    def same_transfer(self, other):
        """True if ``other`` is this very move, not a later one."""
        return (other is not None and bool(self.secret)
                and hmac.compare_digest(self.secret, other.secret or '')
                and self.dest_node == other.dest_node)

    def authentic(self, secret):
        """True if ``secret`` is this transfer's (constant-time compare)."""
        return (bool(self.secret) and isinstance(secret, str)
                and hmac.compare_digest(self.secret.encode(),
                                        secret.encode()))

    @classmethod
    def from_metadata(cls, volume_id, metadata):
        """The transfer in ``metadata``, None if there is none.

        Every value is validated: state written by hand or by a broken
        release raises TransferStateInvalid instead of driving commands.
        """
        metadata = metadata or {}
        if KEY_PREFIX + 'state' not in metadata:
            return None
        raw = {}
        for name in cls.FIELDS:
            if KEY_PREFIX + name not in metadata:
                raise TransferStateInvalid(volume_id=volume_id,
                                           reason='%s%s is missing'
                                           % (KEY_PREFIX, name))
            raw[name] = metadata[KEY_PREFIX + name]
        if raw['state'] not in STATES:
            raise TransferStateInvalid(volume_id=volume_id,
                                       reason='unknown state %r'
                                       % raw['state'])
        try:
            layout.validate_lv_name(raw['lv_name'])
            region = dmsetup.validate_region_size(
                _int(raw['region_sectors'], volume_id, 'region_sectors'))
        except (dmc_exception.InvalidDMName,
                dmc_exception.InvalidTable) as exc:
            raise TransferStateInvalid(volume_id=volume_id,
                                       reason=str(exc)) from None
        for name in ('source_host', 'dest_host', 'source_node', 'dest_node'):
            _match(_HOST_RE, raw[name], volume_id, name)
        if raw['source_host'] == raw['dest_host']:
            raise TransferStateInvalid(volume_id=volume_id,
                                       reason='source and destination are '
                                              'the same host')
        aliases = metadata.get(KEY_PREFIX + 'source_aliases') or ''
        aliases = tuple(_match(_HOST_RE, name, volume_id, 'source_aliases')
                        for name in aliases.split(',') if name)
        secret = metadata.get(KEY_PREFIX + 'secret') or ''
        if secret:
            _match(_SECRET_RE, secret, volume_id, 'secret')
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
            source_aliases=aliases, secret=secret)

    @classmethod
    def metadata_keys(cls):
        return [KEY_PREFIX + n
                for n in cls.FIELDS + cls.OPTIONAL_FIELDS + PROGRESS_KEYS]

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
    """Transfer state in the volume's admin metadata.

    Admin metadata is visible to every service of the deployment (and to
    admins, never to the volume's owner), which is what lets any node tell
    where a volume is in its move.

    This is the only code that writes a transfer's state.  Every writer
    holds the volume's lock (see :func:`cinder_dmclone.mover.lock`), and
    every change of state is conditional: :meth:`transition` re-reads the
    record and changes it only if it is still the same move in one of the
    states the step expects, so a step that lost a race changes nothing.
    """

    def __init__(self, db):
        self.db = db

    def load(self, ctxt, volume_id):
        md = self.db.volume_admin_metadata_get(ctxt, volume_id)
        return Transfer.from_metadata(volume_id, md)

    @staticmethod
    def new_secret():
        return secrets.token_hex(SECRET_BYTES)

    def save(self, ctxt, transfer):
        """Record a new move (with a fresh secret if it has none).

        Progress left by an earlier move (a clear that a crash cut short)
        goes first: it must never be shown as this move's.
        """
        if not transfer.secret:
            transfer.secret = self.new_secret()
        self._delete(ctxt, transfer.volume_id,
                     [KEY_PREFIX + k for k in PROGRESS_KEYS])
        self.db.volume_admin_metadata_update(
            ctxt, transfer.volume_id, transfer.to_metadata(), False)

    def _delete(self, ctxt, volume_id, keys):
        md = self.db.volume_admin_metadata_get(ctxt, volume_id) or {}
        for key in keys:
            if key not in md:
                continue
            try:
                self.db.volume_admin_metadata_delete(ctxt, volume_id, key)
            except exception.CinderException:
                pass

    def ensure_secret(self, ctxt, transfer):
        """Give a move recorded by release 1.1.0 its secret (under lock).

        Steps are only ever sent by the node holding the volume's lock,
        which calls this first: the other node then reads the secret from
        the record like any other field.
        """
        if transfer.secret:
            return
        transfer.secret = self.new_secret()
        self.db.volume_admin_metadata_update(
            ctxt, transfer.volume_id,
            {KEY_PREFIX + 'secret': transfer.secret}, False)

    def transition(self, ctxt, transfer, expected, state):
        """Move ``transfer`` from one of ``expected`` states to ``state``.

        Raises TransferStateConflict, writing nothing, if the record no
        longer describes this move (cleared, replaced by another move) or
        is in a state the step does not expect.
        """
        # A move recorded by release 1.1.0 gets its secret here first (the
        # caller holds the lock, as every writer does).
        self.ensure_secret(ctxt, transfer)
        current = self.load(ctxt, transfer.volume_id)
        if current is None or not transfer.same_transfer(current):
            found = 'none' if current is None else 'another move'
        elif current.state not in expected:
            found = current.state
        else:
            found = None
        if found is not None:
            raise TransferStateConflict(
                volume_id=transfer.volume_id,
                expected='/'.join(expected), found=found)
        self.db.volume_admin_metadata_update(
            ctxt, transfer.volume_id, {KEY_PREFIX + 'state': state}, False)
        transfer.state = state

    def mark_stale_source_attachment(self, ctxt, t):
        """Say, for the status tool, that the move waits for an operator.

        (See Mover._hold; cleared with the move.)
        """
        self.db.volume_admin_metadata_update(
            ctxt, t.volume_id, {KEY_PREFIX + 'stale_source_attachment':
                                t.source_node}, False)

    def publish_progress(self, ctxt, volume_id, progress):
        self.db.volume_admin_metadata_update(
            ctxt, volume_id,
            {KEY_PREFIX + k: v for k, v in progress.as_dict().items()},
            False)

    def clear(self, ctxt, volume_id, transfer=None):
        """Forget the move; with ``transfer``, only if it is still that one.

        A step that ends a move passes it, so that a later move of the
        same volume recorded meanwhile is never erased.
        """
        if transfer is not None and transfer.secret:
            current = self.load(ctxt, volume_id)
            if current is not None and not transfer.same_transfer(current):
                LOG.warning('Not clearing the transfer of volume %s: the '
                            'record describes another move now.', volume_id)
                return
        # The state key goes first: without it the other keys are inert,
        # so a crash part-way leaves no half-described transfer behind.
        state = KEY_PREFIX + 'state'
        keys = [state] + [k for k in Transfer.metadata_keys() if k != state]
        for key in keys:
            try:
                self.db.volume_admin_metadata_delete(ctxt, volume_id, key)
            except exception.CinderException:
                pass

    def move_volume(self, ctxt, volume_id, host, availability_zone=None):
        """Point the volume record at the node that now holds it."""
        values = {'host': host}
        if availability_zone:
            values['availability_zone'] = availability_zone
        self.db.volume_update(ctxt, volume_id, values)


class DestinationNode(object):
    """The steps a destination node takes, each safe to run again.

    ``vg``/``meta_vg`` are Cinder brick LVM objects of the data and
    metadata volume groups, ``dm`` a :class:`~.privileged.DMSetup`,
    ``connector`` an os-brick iSCSI connector and ``execute`` Cinder's.
    ``discard(lv_name)`` removes the data LV (the driver's
    :class:`~cinder_dmclone.wiper.Wiper`, which honours ``volume_clear``);
    by default it is simply deleted.
    """

    def __init__(self, dm, vg, meta_vg, connector, execute, root_helper,
                 lvm_type='default', metadata_reserve=2.0, discard=None):
        self.discard = discard or vg.delete
        self.dm = dm
        self.vg = vg
        self.meta_vg = meta_vg
        self.connector = connector
        self._execute = execute
        self._root_helper = root_helper
        self.lvm_type = lvm_type
        self.metadata_reserve = metadata_reserve

    # -- names ----------------------------------------------------------

    def handle_name(self, t):
        return layout.handle_name(self.vg.vg_name, t.lv_name)

    def lv_path(self, t):
        return layout.lv_device(self.vg.vg_name, t.lv_name)

    def meta_path(self, t):
        return layout.lv_device(self.meta_vg.vg_name,
                                layout.metadata_lv_name(t.lv_name))

    # -- build ----------------------------------------------------------

    def metadata_bytes(self, t):
        return layout.metadata_size_bytes(
            t.clone_sectors * dmsetup.SECTOR_SIZE,
            t.region_sectors * dmsetup.SECTOR_SIZE,
            self.metadata_reserve)

    def check_space(self, t, size_gb, node_name):
        """Refuse a move the volume groups here cannot hold, up front.

        Checked before anything is created, so that a full node answers
        with a clear error instead of failing half way through the build.
        Thin LVs are allocated on write: their pool is not checked here.
        """
        if self.lvm_type == 'thin':
            return
        meta_gb = self.metadata_bytes(t) / units.Gi
        needs = [(self.vg, float(size_gb))]
        if self.meta_vg.vg_name == self.vg.vg_name:
            needs = [(self.vg, size_gb + meta_gb)]
        else:
            needs.append((self.meta_vg, meta_gb))
        for vg, need in needs:
            vg.update_volume_group_info()
            if vg.vg_free_space < need:
                raise dmc_exception.DestinationFull(
                    node=node_name, volume=t.volume_id, vg=vg.vg_name,
                    free=vg.vg_free_space, need=need)

    def create_volumes(self, t, size_gb):
        """Create the data LV and a freshly zeroed metadata LV.

        Only called in ``preparing``: the metadata LV is zeroed right after
        it is created, never later (zeroing a used one would forget which
        regions hold the instance's writes).
        """
        # The metadata LV comes first: it is what recovery looks for, so a
        # crash between the two creations leaves nothing it cannot see.
        meta_name = layout.metadata_lv_name(t.lv_name)
        if self.meta_vg.get_volume(meta_name) is None:
            size = self.metadata_bytes(t)
            self.meta_vg.create_volume(meta_name, '%dm' % (size // units.Mi),
                                       'default')
            self._zero_head(self.meta_path(t))
        if self.vg.get_volume(t.lv_name) is None:
            self.vg.create_volume(t.lv_name, '%dg' % size_gb, self.lvm_type)

    def _zero_head(self, path):
        """Zero the metadata LV's first MiB so dm-clone formats it."""
        privileged.zero_metadata_head(path, execute=self._execute,
                                      root_helper=self._root_helper)

    def connect_source(self, t, provider_auth):
        """Log in to the source's export; return the local device path."""
        info = self.connector.connect_volume(
            t.source_properties(provider_auth))
        path = info['path']
        size = self.dm.device_sectors(path)
        if size < t.clone_sectors:
            self.connector.disconnect_volume(
                t.source_properties(provider_auth), info, force=True,
                ignore_errors=True)
            raise dmc_exception.InvalidTable(
                reason='source device %s of volume %s has %d sectors, the '
                       'clone needs %d' % (path, t.volume_id, size,
                                           t.clone_sectors))
        return path

    def disconnect_source(self, t, provider_auth):
        self.connector.disconnect_volume(
            t.source_properties(provider_auth), None, force=True,
            ignore_errors=True)

    def clone_table(self, t, source_path, hydrate, threshold=None,
                    batch_size=None):
        """Clone over the transfer's length, linear beyond (an extension)."""
        lv = self.lv_path(t)
        segments = [dmsetup.clone_segment(
            0, t.clone_sectors, self.meta_path(t), lv, source_path,
            t.region_sectors, hydration=hydrate,
            hydration_threshold=threshold, hydration_batch_size=batch_size)]
        total = self.dm.device_sectors(lv)
        if total > t.clone_sectors:
            segments.append(dmsetup.linear_segment(
                t.clone_sectors, total - t.clone_sectors, lv,
                t.clone_sectors))
        return segments

    def build_clone(self, t, source_path, hydrate, threshold=None,
                    batch_size=None):
        """Create the clone under the volume's handle (idempotent)."""
        name = self.handle_name(t)
        if self.dm.exists(name):
            if any(s.target == 'clone' for s in self.dm.table(name)):
                return layout.handle_path(self.vg.vg_name, t.lv_name)
            raise dmc_exception.InvalidTable(
                reason='handle %s exists without a clone table; refusing '
                       'to replace it' % name)
        self.dm.create(name, self.clone_table(t, source_path, hydrate,
                                              threshold, batch_size),
                       uuid=layout.handle_uuid(self.vg.vg_name, t.lv_name))
        return layout.handle_path(self.vg.vg_name, t.lv_name)

    def enable_hydration(self, t):
        self.dm.message(self.handle_name(t), 'enable_hydration')

    def tune(self, t, threshold, batch_size):
        name = self.handle_name(t)
        self.dm.message(name, 'hydration_threshold', threshold)
        self.dm.message(name, 'hydration_batch_size', batch_size)

    def extend(self, t):
        """Reload the table after the data LV grew: clone + linear tail."""
        name = self.handle_name(t)
        current = self.dm.table(name)
        clone = [s for s in current if s.target == 'clone']
        if not clone:
            return False
        args = dmsetup.parse_clone_table(clone[0])
        status = self.dm.status(name)[0].clone
        table = self.clone_table(
            t, args.source_dev,
            hydrate=bool(status and status.hydration_enabled),
            threshold=args.core_args.get('hydration_threshold'),
            batch_size=args.core_args.get('hydration_batch_size'))
        self.dm.reload(name, table)
        return True

    # -- finish ---------------------------------------------------------

    def hydrated(self, t):
        name = self.handle_name(t)
        if not self.dm.exists(name):
            return False
        status = [s.clone for s in self.dm.status(name) if s.clone]
        if not status:
            return True     # already linear
        return status[0].fully_hydrated

    def swap_to_linear(self, t):
        """Replace a fully hydrated clone by a linear map of the LV."""
        name = self.handle_name(t)
        if not self.dm.exists(name):
            # Gone with a reboot: once the metadata LV is removed the swap
            # was done (the driver maps the LV again); before, only a
            # rebuilt clone can tell whether the LV is complete.
            if self.has_metadata(t):
                raise dmc_exception.InvalidTable(
                    reason='handle %s is gone before its clone was swapped '
                           'to linear; the clone must be rebuilt first'
                           % name)
            return
        if not any(s.target == 'clone' for s in self.dm.table(name)):
            return
        if not self.hydrated(t):
            raise dmc_exception.InvalidTable(
                reason='refusing to swap %s to linear before it is fully '
                       'hydrated' % name)
        lv = self.lv_path(t)
        self.dm.reload(name, [dmsetup.linear_segment(
            0, self.dm.device_sectors(lv), lv)])

    def written(self, t):
        """True if the clone may hold data the source does not have.

        In ``cloned`` hydration is off, so a region is hydrated only
        because the instance wrote (or discarded) it here.  Without a
        clone to ask (a reboot), the answer is yes: never assume a clone
        holds nothing.
        """
        name = self.handle_name(t)
        if not self.dm.exists(name):
            return True
        status = [s.clone for s in self.dm.status(name) if s.clone]
        return not status or status[0].hydrated_regions > 0

    def has_data(self, t):
        return self.vg.get_volume(t.lv_name) is not None

    def has_metadata(self, t):
        return self.meta_vg.get_volume(
            layout.metadata_lv_name(t.lv_name)) is not None

    def needs_rebuild(self, t):
        """True if the clone is gone (a reboot) while its metadata is not."""
        return not self.dm.exists(self.handle_name(t)) and \
            self.has_metadata(t)

    def remove_metadata(self, t):
        meta_name = layout.metadata_lv_name(t.lv_name)
        if self.meta_vg.get_volume(meta_name) is not None:
            self.meta_vg.delete(meta_name)

    def tear_down(self, t, provider_auth):
        """Remove everything the transfer built here (a rollback).

        The data LV goes (to be wiped) before the metadata LV: while a
        metadata LV is there nothing maps the partly hydrated data LV on
        its own (the driver's guard), so a crash in between never exposes
        it.
        """
        self.dm.remove(self.handle_name(t))
        self.disconnect_source(t, provider_auth)
        if self.has_data(t):
            self.discard(t.lv_name)
        self.remove_metadata(t)
