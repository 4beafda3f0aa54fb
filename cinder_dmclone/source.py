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

"""The source's side of a move: the node a volume leaves.

An instance on another node attaches the volume: :meth:`Source.move`
exports it to that node, asks the node's service to build the clone and
records the move.  Afterwards the destination asks for three steps
(``closed``: before a commit, is the copy here closed?; ``release``: drop
the export made for the move after a rollback; ``retire``: the volume has
left, remove the export and the old copy), which run inside the
destination's critical section and so take no lock.
"""

import collections
import contextlib
import time

from oslo_log import log as logging
from oslo_utils import excutils
from oslo_utils import units

from cinder.common import constants
from cinder import exception
from cinder.i18n import _
from cinder import objects
from cinder.volume import volume_utils

from cinder_dmclone import attachments
from cinder_dmclone import dmsetup
from cinder_dmclone import evidence
from cinder_dmclone import exception as dmc_exception
from cinder_dmclone import layout
from cinder_dmclone import move
from cinder_dmclone import peer
from cinder_dmclone import privileged
from cinder_dmclone import side

LOG = logging.getLogger(__name__)

#: The connector a give-up names when it no longer knows the
#: destination's: removing the export removes its ACLs with it.
ANY_INITIATOR = {'initiator': None, 'host': None}


def service_host(ctxt, volume, node):
    """The volume host string and AZ of ``node``'s service, or None.

    A node's service runs the same backend section under the node's name
    (``<node>@<section>``); the pool is the backend name.
    """
    backend = volume_utils.extract_host(volume['host'], 'backend')
    section = backend.partition('@')[2]
    dest_backend = '%s@%s' % (node, section)
    service = _volume_service(ctxt, dest_backend)
    if service is None:
        return None, None
    if service.disabled or not service.is_up:
        raise exception.VolumeBackendAPIException(
            data=_('Cannot move volume %(vol)s to node %(node)s: its '
                   'volume service %(svc)s is down or disabled.')
            % {'vol': volume['id'], 'node': node, 'svc': dest_backend})
    pool = volume_utils.extract_host(volume['host'], 'pool')
    return (volume_utils.append_host(dest_backend, pool),
            service.availability_zone)


def host_zone(ctxt, host):
    """The availability zone of the volume service behind ``host``.

    None when the service is unknown: the record keeps its zone.
    """
    service = _volume_service(ctxt, host)
    return None if service is None else service.availability_zone


def name_destination(store, ctxt, volume, t):
    """Point ``volume``'s record at move ``t``'s destination, again.

    The source records a commit, then points the record at the
    destination: two writes.  When the second was lost, whoever ends the
    move on the destination (its finalization, or an abandon of its
    lost source) makes it, and logs that it did.  The caller has checked
    that the record names the move's source.
    """
    LOG.warning('Volume %(vol)s was moved to %(dst)s from %(src)s, but its '
                'record still names %(src)s (its last step there did not '
                'reach the database): it names %(dst)s now.',
                {'vol': volume['id'], 'src': t.source_node,
                 'dst': t.dest_node})
    store.move_volume(ctxt, volume['id'], t.dest_host,
                      host_zone(ctxt, t.dest_host))


def service_is_up(ctxt, host):
    """True if the volume service behind ``host`` reports itself up.

    Cinder's own reading of the service's heartbeat: up until
    ``service_down_time`` after its last report, and as soon as it starts
    (before its recovery has re-exported anything).  A hint, then, that
    keeps a caller from waiting on a node that is surely down; a login
    after it may still fail, and the caller tries again later.
    """
    service = _volume_service(ctxt, host)
    return service is not None and service.is_up


def _volume_service(ctxt, host):
    """The volume service behind ``host`` (a host or backend), or None."""
    backend = volume_utils.extract_host(host, 'backend')
    try:
        return objects.Service.get_by_args(ctxt, backend,
                                           constants.VOLUME_BINARY)
    except exception.ServiceNotFound:
        return None


def _initiator(connector):
    """The connector's iSCSI initiator (lowercase; '' if it names none)."""
    return str((connector or {}).get('initiator') or '').lower()


class Source(side.Side):
    """Moves of volumes away from this node.

    Besides the shared tools (see :class:`~cinder_dmclone.side.Side`):
    the target driver that exports the volume to the destination, the
    node's device-mapper and data volume group name (the volume's handle
    goes with the old copy), the :class:`~cinder_dmclone.wiper.Wiper` that
    removes old copies, and the region size moves are cut in.
    """

    #: How long a ``closed`` step waits for the handle's last user (an
    #: instance's process that is exiting, udev's probe) to let go: well
    #: inside the destination's RPC timeout.
    CLOSE_WAIT = 5
    CLOSE_POLL = 0.5

    def __init__(self, node_names, node_name, store, peer_client,
                 target_driver, dm, volume_group, wiper, region_sectors,
                 lio_openers=privileged.lio_openers,
                 lio_acls=privileged.lio_acls, sleep=time.sleep,
                 clock=time.monotonic, ensure_export=None,
                 lio_target_exists=privileged.lio_target_exists,
                 service_host=None, thin_maps=None, evidence=None):
        super().__init__(node_names, node_name, store, peer_client,
                         service_host=service_host, evidence=evidence)
        self.target_driver = target_driver
        self.dm = dm
        self.volume_group = volume_group
        self.wiper = wiper
        self.region_sectors = region_sectors
        self._lio_openers = lio_openers
        self._lio_acls = lio_acls
        self._lio_target_exists = lio_target_exists
        self._sleep = sleep
        self._clock = clock
        #: the driver's ensure_export for a volume whose record names
        #: another node (handle, then LIO's saved targets).
        self._ensure_export = ensure_export
        #: volume id -> a move from here whose attempt failed and could
        #: not record its end (the database was away): see
        #: :meth:`retry_give_ups`.
        self.unrecorded = {}
        #: volume ids whose export a start could not rid of the ACL of a
        #: move that is over (see :meth:`drop_leftover_export`): the
        #: monitor tries again.
        self.leftover_exports = set()
        #: volume id -> [(initiator, when)]: each iSCSI attach from
        #: another node that made or reused the volume's export (at
        #: ``clock`` time ``when``) and has not admitted its initiator
        #: yet (see :meth:`export_for_attach`).
        self.attaches_in_flight = {}
        #: the :class:`~cinder_dmclone.region_map.ThinMaps` of this node's
        #: volume group, or None (dmclone_thin_map off: no map is sent).
        self.thin_maps = thin_maps
        #: volume id -> how many writers without an attachment (an image
        #: being written, see :meth:`writing`) its copy here has.
        self.writers = collections.Counter()
        #: ids of the volumes whose migration from here is being started
        #: (see :meth:`_migration_starting`).
        self.migrations_starting = set()
        #: ``restore(volume, record)``: this node's destination side
        #: writing back the record of a move into this node that a stale
        #: save replaced (Destination.restore_contradicted); returns the
        #: move written back, or None.  None: nothing is restored here.
        self.restore = None

    # -- starting a move ---------------------------------------------------

    def wants_move(self, volume, connector):
        """True if this attach should move the volume to the connector.

        A multiattach volume never moves: each node's copy would take its
        own writes, so instances on two nodes would see two disks.  It
        stays where it is and other nodes reach it over iSCSI.  Nor does
        a volume that another node uses over iSCSI (a node without this
        backend's service, a backup host, or the attaching node itself
        through an earlier attachment): the move would hydrate from a
        copy that node still writes, and retire that copy under it.
        """
        if volume.get('multiattach'):
            return False
        dest_node = connector.get('host')
        if dest_node in self.node_names:
            return False
        current = attachments.current(volume)
        if not attachments.is_instance_attach(volume, current):
            return False
        # The destination's own active attachments count too: one there
        # already reaches this copy over iSCSI, and would keep writing to
        # it while the move hydrates from it.  (The attach being made now
        # is still reserved, not active.)
        others = attachments.elsewhere(volume, self.node_names, current)
        if others:
            LOG.info('Volume %(vol)s stays on %(src)s, reached over iSCSI '
                     'from %(dst)s: attachments on %(hosts)s use its copy '
                     'here.', {'vol': volume['id'], 'src': self.node_name,
                               'dst': dest_node,
                               'hosts': ', '.join(
                                   host or '(no host recorded)'
                                   for host in others)})
            return False
        return True

    def move(self, volume, connector, read_sectors, migration=False):
        """Move ``volume`` to the connector's node; return conn info.

        Runs inside the attach request.  The destination's service builds
        the clone over this node's export (ACL for its initiator only) and
        returns a local connection; the volume record then names the
        destination.  Any failure leaves the volume here, untouched, with
        nothing left on either node.  None: the volume stays here and the
        connector's node reaches it over iSCSI (that node runs no service
        of this backend, or this node's export admits another node).
        ``read_sectors()`` gives the LV's length now: read under the lock,
        which an online extend takes too, the clone recorded covers the
        whole LV (read before, an extend in between would leave its tail
        on this node only, to be wiped with the old copy).

        ``migration``: no attach asked for the move (``cinder migrate``);
        it is refused if the volume has any attachment now.  Either way,
        a volume that its own service writes or reads here without an
        attachment is refused (:meth:`_refuse_unless_movable`).
        Hydration starts at once only if no attachment may use the copy
        here (:meth:`_may_be_used_here`).  An attach's move is given up if
        an attachment that was being set up when it began is gone
        (:meth:`_refuse_if_attach_withdrawn`).
        """
        ctxt = self.ctxt()
        dest_node = connector['host']
        asked = None if migration else self._attaches_starting(volume)
        with move.lock(volume['id']), self._migration_starting(volume,
                                                               migration):
            lv_sectors = read_sectors()
            self._check_source_size(volume, lv_sectors)
            self._give_up_stale_prepare(volume)
            self.refuse_if_moving(volume, _('attaching on %s') % dest_node)
            self._refuse_snapshots(ctxt, volume)
            self._refuse_unless_movable(volume, migration)
            self._refuse_if_attach_withdrawn(volume, asked, prepared=False)
            dest_host, dest_az = service_host(ctxt, volume, dest_node)
            if dest_host is None:
                LOG.warning('No volume service of this backend on node '
                            '%(dst)s: attaching volume %(vol)s there over '
                            'iSCSI.', {'dst': dest_node, 'vol': volume['id']})
                return None
            t = self._record(ctxt, volume, connector, dest_host, lv_sectors)
            if t is None:
                return None
            # Read after the move is recorded: see _may_be_used_here.
            current = attachments.current(volume)
            hydrate = not self._may_be_used_here(volume, current, migration)
            LOG.info('Moving volume %(vol)s from %(src)s to %(dst)s '
                     '(hydration %(h)s).',
                     {'vol': volume['id'], 'src': self.node_name,
                      'dst': dest_node,
                      'h': 'now' if hydrate else 'after detach here'})
            try:
                self._mark_part(t)
                params = {'hydrate': hydrate, 'size_gb': volume['size']}
                region_map = self._region_map(t) if hydrate else None
                if region_map:
                    params[peer.REGION_MAP] = region_map
                info = self.peer.prepare(ctxt, volume, dest_host, connector,
                                         t.secret, **params)
                self._refuse_if_attach_withdrawn(volume, asked)
                # Only the lock holder writes the state: the destination
                # answered, the move is recorded here, under the lock.
                self.store.transition(
                    ctxt, t, (move.PREPARING,),
                    move.HYDRATING if hydrate else move.CLONED)
            except Exception:
                with excutils.save_and_reraise_exception():
                    self._undo_move(ctxt, volume, connector, t)
            self.store.move_volume(ctxt, volume['id'], dest_host, dest_az)
            LOG.info('Volume %(vol)s now lives on %(dst)s.',
                     {'vol': volume['id'], 'dst': dest_host})
            return info

    def _mark_part(self, t):
        """Mark that this node is ``t``'s source, before anything is built.

        (:mod:`~cinder_dmclone.evidence`.)  PartNotRecorded if the mark
        is not on disk: the move is given up, as any failed attempt.
        """
        if self.evidence is not None:
            self.evidence.record(t, evidence.SOURCE)

    def end_part(self, volume_id, t):
        """This node's part as the source of move ``t`` is over.

        Its mark goes before the record is cleared: a crash in between
        leaves a record without a mark (no evidence), never a mark of a
        move that is over.
        """
        if self.evidence is not None:
            self.evidence.forget(volume_id, t)

    @contextlib.contextmanager
    def _migration_starting(self, volume, migration):
        """Around a migration's move, under the volume's lock.

        While it runs, a local attach here is refused
        (:meth:`refuse_local_attach`).  Cinder 29's manager writes an
        attachment ``attaching`` (with its host) only after the driver
        handed out its connection, so a local attach answered after the
        migration's check for attachments, before the move is recorded,
        would show only a reserved attachment with no host until then:
        what an orphan looks like, which holds no commit.  Both run in
        this service (the volume's), so this mark and the attachment
        that Cinder reserved before it asked for the connection leave no
        gap: a local attach checked before the mark was set is seen by
        the migration's check, which refuses; one checked after is
        refused here; and once the move is recorded, the record refuses.
        """
        if not migration:
            yield
            return
        self.migrations_starting.add(volume['id'])
        try:
            yield
        finally:
            self.migrations_starting.discard(volume['id'])

    def keeps_export(self, volume):
        """True if the volume's export here must stay when a connection goes.

        A move from here reads it (until the move ends).  So does the one
        a migration being started here makes (:meth:`_migration_starting`):
        a local attach it refuses meanwhile is cleaned up by Cinder's
        manager with the driver's remove_export, which would otherwise
        take the export from under the migration.
        """
        return (volume['id'] in self.migrations_starting
                or self.is_source(self.load(volume['id'])))

    def keeps_acl(self, volume, connector):
        """True if a detach of another node's ``connector`` leaves its ACL.

        While a move from here is recorded (or a migration is being
        started here), this node's export of the volume admits the
        move's destination alone: a move starts only over an export that
        admits no other node (:meth:`_admits_only`), and every iSCSI
        attach is refused while it is recorded.  That ACL is the one the
        destination's clone reads every region it has not copied
        through; the move's own end (release, retire, give-up) removes
        it.  A detach reaching this node with another node's connector
        meanwhile was routed by a read of the volume record older than
        the move's commit (the destination's attachment, which cinder-api
        sent here), or is the owner's legacy ``os-terminate_connection``
        with an initiator of its choosing: removing the ACL by that
        initiator would cut the clone off from the source, and nothing
        would admit it again.  The detach itself succeeds; the
        destination's own is passed on to it (:meth:`pass_on_detach`).
        """
        if not self.keeps_export(volume):
            return False
        LOG.warning('Volume %(vol)s: a detach of %(host)s (initiator '
                    '%(ini)s) reached this node, the source of its move: '
                    'its export keeps every ACL until the move ends (the '
                    'detach was routed by an older read of the volume '
                    'record?).',
                    {'vol': volume['id'],
                     'host': (connector or {}).get('host'),
                     'ini': (connector or {}).get('initiator')})
        return True

    def pass_on_detach(self, volume, connector):
        """Tell a move's destination that a detach of its connection came here.

        For a detach whose ACL this node keeps (:meth:`keeps_acl`).  When
        it names the move's destination (its connector's host) and the
        move is in its ``cloned`` window (or was, before a stale save set
        its record back to ``preparing``: the volume record names the
        destination), it was routed by a read of the volume record older
        than the commit: Nova rolling back a live migration deletes the
        destination's attachment while the instance stays here.  Dropped,
        the destination would never learn it: the move would stay
        ``cloned`` for as long as the instance runs here (the volume
        refused as moving), then commit to the destination at its detach
        here.  So the destination is asked to handle it as if it had
        reached it (:meth:`Destination.detached_at_source
        <cinder_dmclone.destination.Destination.detached_at_source>`),
        which decides under the volume's lock and never rolls back a
        clone that took writes.  Not under the lock (the destination
        takes it).  Never raises: the detach itself succeeds, and a
        destination that does not answer is logged.
        """
        host = (connector or {}).get('host')
        try:
            t = self.load(volume['id'])
            if not (self.is_source(t) and host and host == t.dest_node
                    and self._in_window(volume, t)):
                return
            if not t.secret:
                LOG.warning('Volume %s: its move was recorded by release '
                            '1.1.0 (no secret): the detach of its '
                            'destination is not passed on.', volume['id'])
                return
            LOG.warning('Volume %(vol)s: a detach of %(dst)s, the '
                        'destination of its move, reached this node (routed '
                        'by an older read of the volume record); asking '
                        '%(dst)s to handle it.',
                        {'vol': volume['id'], 'dst': t.dest_node})
            self.peer.request(self.ctxt(), volume, t.dest_host,
                              peer.DETACHED, t.secret)
        except Exception:
            LOG.exception('Volume %(vol)s: could not pass the detach of '
                          '%(dst)s on to it: its move stays as it is (in '
                          'its cloned window until a detach on %(dst)s '
                          'rolls it back, or the detach here commits '
                          'it).', {'vol': volume['id'], 'dst': host})

    def _in_window(self, volume, t):
        """True if move ``t`` from here is ``cloned``, or set back.

        Set back: committed, then recorded ``preparing`` again by a stale
        save (the volume record names the destination), which the
        destination rolls forward first.
        """
        if t.state == move.CLONED:
            return True
        return t.state == move.PREPARING and self.names_destination(
            objects.Volume.get_by_id(self.ctxt(), volume['id']), t)

    #: volume statuses in which an attach's move may start (``reserved``:
    #: Cinder reserved the volume for it; ``in-use``: a live migration).
    MOVABLE = ('available', 'reserved', 'attaching', 'in-use')
    #: volume statuses in which Cinder 29's manager hands a migration to
    #: the driver (volume/manager.py migrate_volume, which restores
    #: ``previous_status`` only after the driver returned): ``available``;
    #: ``maintenance``, set by volume/api.py migrate_volume for
    #: ``--lock-volume True`` (no action allowed on the volume: the safe
    #: drain); ``retyping``, set by volume/api.py retype when the manager
    #: lets the driver migrate (_can_use_driver_migration).  None of them
    #: is a write or read by the volume's own service.  (``in-use`` never
    #: reaches the driver: the manager copies an attached volume itself.)
    MIGRATABLE = ('available', 'maintenance', 'retyping')

    def _refuse_unless_movable(self, volume, migration):
        """Refuse a move while the copy here is used without an attachment.

        Under the volume's lock, with the record read now (the caller's
        object may predate what started since).  The volume's own service
        writes to the LV here while an image is written to it
        (``downloading``, which Cinder lets Nova reserve), or a backup is
        restored to it, and reads it for a backup or an image upload: no
        attachment shows it, no map or hydration must start from it, and
        the old copy must not be retired under it.  An image being written
        is also known in this process (:meth:`writing`): Cinder's reserve
        overwrites the ``downloading`` status with ``reserved``.  A
        migration (no attach asked for it) is refused as well if the
        volume has any attachment now: Cinder's reserve of an attachment
        checks the status, not the migration status, so an attach may
        have started since the manager loaded the volume.  Any attachment
        counts, a reserved one with no host too: Cinder reserves it before
        it asks any node for a connection, so a racing attach is always
        visible here.  So is an orphan (an ``attachment_create`` with a
        connector whose connection failed leaves its attachment reserved,
        and its caller never learnt its id): the message names the ids
        and how an operator clears one that no instance uses.
        """
        current = objects.Volume.get_by_id(self.ctxt(), volume['id'])
        status = current.status
        reason = None
        if volume['id'] in self.writers:
            reason = _('an image is being written to it')
        elif status not in (self.MIGRATABLE if migration else self.MOVABLE):
            reason = _('its status is %s') % status
        elif migration:
            ids = sorted(a.id for a in attachments.current(volume))
            if ids:
                reason = _(
                    'an attach of it started: it has attachment(s) '
                    '%(ids)s (one left reserved by a failed attach, which '
                    'no instance uses, is cleared with "cinder '
                    'attachment-delete <id>")') % {'ids': ', '.join(ids)}
        if reason is None:
            return
        LOG.warning('Volume %(vol)s stays on %(node)s: %(why)s.',
                    {'vol': volume['id'], 'node': self.node_name,
                     'why': reason})
        raise dmc_exception.VolumeNotMovable(
            volume=volume['id'], node=self.node_name, reason=reason)

    def _may_be_used_here(self, volume, current, migration):
        """True if an attachment (besides the move's own) may use the copy.

        ``current`` is read after the move was recorded.

        An attach's move: an active attachment on any name of this node
        (one made under an alias still writes to the source).  No other
        attach of the volume can be starting here meanwhile: the volume
        is not multiattach (:meth:`wants_move`), and Cinder 29's
        ``_attachment_reserve`` (volume/api.py) reserves a
        non-multiattach volume only while it is ``available`` (or
        ``downloading``, which :meth:`_refuse_unless_movable` refuses);
        a second reserve of a ``reserved`` or ``in-use`` one is refused
        unless the volume already has an attachment of the same instance
        (a live migration, whose source attachment is counted here).  So
        a reserved attachment with no host is this attach's own, or one
        of the same instance that a failed ``attachment_create`` left
        behind: neither uses the copy here, and neither may hold the
        move (an orphan would hold it for ever).

        A migration (no attach asked for it; it was refused if the volume
        had any attachment, :meth:`_refuse_unless_movable`): any
        attachment now, whatever its host, is an attach that started
        since, maybe a local one whose path this node handed out before
        the move was recorded.  A local connection is refused once a move
        is recorded (:meth:`refuse_local_attach`) and Cinder reserves an
        attachment before it asks for its connection, so of a local
        attach and a migration, whichever comes second sees the other,
        whatever the locks.
        """
        if migration:
            return any(a.attach_status in attachments.IN_USE
                       for a in current)
        return attachments.on(volume, self.node_names, current) > 0

    def _region_map(self, t):
        """The regions move ``t``'s thin LV holds (encoded), or None.

        Only for a move that hydrates at once, whose LV no attachment
        here uses (the caller checks): the move is recorded, so any new
        attach of the volume here is refused, and from now until the
        destination stops reading it nothing writes to the LV
        (doc/source/contributor/thin-map.rst).  As a second guard the
        handle must have no opener but LIO's export.  None when this node
        sends no maps (``dmclone_thin_map``) or the map cannot be taken:
        every region is copied.
        """
        if self.thin_maps is None:
            return None
        try:
            users = self._users(layout.handle_name(self.volume_group,
                                                   t.lv_name))
        except Exception:
            LOG.warning('Volume %s: cannot tell who holds its handle; every '
                        'region is copied.', t.volume_id, exc_info=True)
            return None
        if users > 0:
            LOG.info('Volume %(vol)s: its handle here has %(n)d user(s) '
                     'besides LIO; every region is copied.',
                     {'vol': t.volume_id, 'n': users})
            return None
        return self.thin_maps.take(t.lv_name, t.clone_sectors,
                                   t.region_sectors)

    def _undo_move(self, ctxt, volume, connector, t):
        """A move failed before its outcome was seen: undo it unless it stands.

        Never raises: the caller re-raises the move's own error.  The
        commit's write may have reached the database although its answer
        was lost (oslo.db raised): the record, read again, then shows the
        move committed; the destination hydrates from this node's export
        and names itself in the volume record when it finalizes, so
        everything stays (the destination would refuse an abort anyway).
        Otherwise the move is given up (:meth:`_give_up_failed_move`),
        which reads the record again before it drops the export: while
        the database cannot tell whether the commit landed, the export
        stays and the give-up is retried.
        """
        try:
            current = self.load_any(volume['id'])
        except Exception:
            LOG.warning('Volume %s: cannot read its move again to tell '
                        'whether it committed; it is given up once the '
                        'database tells it never did.', volume['id'],
                        exc_info=True)
            current = None
        if self._stands(t, current):
            self._report_stands(t, current.state)
            return
        LOG.error('The move of volume %(vol)s to %(dst)s failed; it '
                  'stays on %(src)s.', {'dst': t.dest_node,
                                        'vol': volume['id'],
                                        'src': self.node_name})
        self._give_up_failed_move(ctxt, volume, connector, t)

    @staticmethod
    def _stands(t, current):
        """True if ``current`` records move ``t`` committed after all."""
        return t.same_move(current) and current.state not in move.UNCOMMITTED

    @staticmethod
    def _report_stands(t, state):
        """Say that move ``t``, whose attach failed, is ``state`` after all."""
        LOG.error('Volume %(vol)s: its move to %(dst)s is recorded '
                  '%(state)s although its attach failed (the database '
                  'took the commit but its answer was lost). The move '
                  'stands: %(dst)s hydrates from the export here and '
                  'names itself in the volume record when it finishes; '
                  'nothing is undone.',
                  {'vol': t.volume_id, 'dst': t.dest_node, 'state': state})

    def _give_up_failed_move(self, ctxt, volume, connector, t):
        """Give up a move that never committed, with the export made for it.

        The destination may have built (part of) the clone before failing
        to answer (a timeout, a restart): it is asked to drop its side
        while the state still describes the move -- also when the
        database did not let the export be forgotten.  A failure is
        logged and remembered: this attempt is over, so the move is given
        up as soon as the database answers again (the next attach, or
        :meth:`retry_give_ups` at the next monitor tick), not only once it
        outlived any attempt.  Its export stays until then (see
        :meth:`_drop_export_unless_committed`).
        """
        try:
            self.give_up(ctxt, volume, t, connector, own_attempt=True)
        except Exception:
            self.unrecorded[volume['id']] = t
            LOG.exception('Could not give up the move of volume %(vol)s to '
                          '%(dst)s; retrying while this service runs.',
                          {'vol': volume['id'], 'dst': t.dest_node})

    def retry_give_ups(self):
        """Give up the moves whose failed attempt could not (monitor tick).

        Under the volume's lock, and only the very move remembered (its
        secret), still recorded as that attempt left it: a later move of
        the volume is never touched.  Kept for the next tick while the
        database is still away, or while another step holds the lock
        (:func:`~cinder_dmclone.move.lock_if_free`: the tick never waits).
        """
        for volume_id in list(self.unrecorded):
            try:
                with move.lock_if_free(volume_id) as locked:
                    if locked:
                        self._retry_give_up(volume_id)
            except Exception:
                LOG.warning('Volume %s: giving up its failed move failed '
                            'again; retrying at the next tick.', volume_id,
                            exc_info=True)
        for volume_id in sorted(self.leftover_exports):
            try:
                with move.lock_if_free(volume_id) as locked:
                    if locked and self.drop_leftover_export(volume_id):
                        self.leftover_exports.discard(volume_id)
            except Exception:
                LOG.warning('Volume %s: removing the ACL of a move that is '
                            'over from its export failed again; retrying '
                            'at the next tick.', volume_id, exc_info=True)

    def _retry_give_up(self, volume_id):
        volume, t = self._failed_move_here(volume_id)
        if t is None:
            # The record may be gone while the export still admits the
            # destination: the destination ended the move ('aborted')
            # and its start cleared it.
            if not self.drop_leftover_export(volume_id):
                self.leftover_exports.add(volume_id)
            self.unrecorded.pop(volume_id, None)
            return
        LOG.info('Volume %(vol)s: giving up its move to %(dst)s, whose '
                 'attach failed while the database was away.',
                 {'vol': volume_id, 'dst': t.dest_node})
        self.give_up(self.ctxt(), volume, t, ANY_INITIATOR)

    def _failed_move_here(self, volume_id):
        """The volume and the move its failed attempt left, if it stands.

        ``(None, None)`` once the record holds another move or a
        committed one (the attempt's commit landed unseen: it stands,
        with its export), or the volume is gone or no longer lives here:
        nothing is left to give up.
        """
        try:
            t = self.load_any(volume_id)
            if t is None or not self._ended_here(t):
                return None, None
            if t.state not in move.UNCOMMITTED:
                self._report_stands(t, t.state)
                return None, None
            volume = objects.Volume.get_by_id(self.ctxt(), volume_id)
        except exception.VolumeNotFound:
            return None, None
        if not self.lives_here(volume):
            return None, None
        return volume, t

    def _ended_here(self, t):
        """True if ``t`` is a move whose attempt here failed and returned."""
        ended = self.unrecorded.get(t.volume_id)
        return ended is not None and ended.same_move(t)

    def _record(self, ctxt, volume, connector, dest_host, lv_sectors):
        """Export the volume to the destination and record the move.

        None, with nothing recorded, when the export admits another node
        too (see :meth:`_admits_only`): the destination keeps its ACL,
        which its iSCSI connection then uses.
        """
        data = self.target_driver.initialize_connection(
            volume, connector)['data']
        if not self._admits_only(volume, connector, data['target_iqn']):
            return None
        t = move.Move(
            volume_id=volume['id'], lv_name=volume['name'],
            state=move.PREPARING, source_host=volume['host'],
            dest_host=dest_host, source_node=self.node_name,
            dest_node=connector['host'], region_sectors=self.region_sectors,
            clone_sectors=lv_sectors, target_portal=data['target_portal'],
            target_iqn=data['target_iqn'],
            target_lun=data.get('target_lun', 0),
            source_aliases=tuple(sorted(self.node_names - {self.node_name})))
        try:
            self.store.save(ctxt, t, budget=self.move_budget(),
                            initiator=connector.get('initiator'))
        except Exception:
            with excutils.save_and_reraise_exception():
                self._drop_unrecorded_acl(volume, connector)
        return t

    def move_budget(self):
        """Seconds an attempt to move a volume away from here may last.

        The prepare's (:meth:`~cinder_dmclone.side.Side.stale_prepare_after`),
        and, when this node sends thin maps, the time a map may take
        (:attr:`ThinMaps.TIME_LIMIT
        <cinder_dmclone.region_map.ThinMaps.TIME_LIMIT>`): it is taken
        after the move is recorded, and must not make a running attempt
        look outlived.
        """
        budget = self.stale_prepare_after()
        if self.thin_maps is not None:
            budget += self.thin_maps.TIME_LIMIT
        return budget

    def _drop_unrecorded_acl(self, volume, connector):
        """The move's write failed: remove the ACL just made for it.

        Nothing else records that ACL (it is recorded with the move), and
        nothing would ever remove it.  Should the write have landed
        unseen, the move is 'preparing' with no attempt left: it is
        ended as an outlived prepare, and its give-up finds no ACL to
        remove.  Never raises: the write's error is what the caller
        reports.
        """
        try:
            self.target_driver.terminate_connection(volume, connector)
        except Exception:
            LOG.exception('Volume %(vol)s: its export still admits '
                          'initiator %(ini)s, for a move the database did '
                          'not record; remove that ACL by hand.',
                          {'vol': volume['id'],
                           'ini': connector.get('initiator')})

    def _admits_only(self, volume, connector, target_iqn):
        """True if the export admits the destination's initiator alone.

        Cinder records an attachment as ``attaching`` only after the
        driver's initialize_connection returned: another node's attach
        whose export was just made here (its initiator in the ACL) is
        invisible in the attachments, and would write to the copy this
        move retires.  Its ACL is made under the volume's lock (see
        :meth:`connect_over_iscsi`), so reading the ACL under the lock
        sees it.  An ACL that does not even show the destination's
        initiator cannot be trusted either: the volume stays put.
        """
        wanted = (connector.get('initiator') or '').lower()
        admitted = self._lio_acls(target_iqn)
        if admitted == {wanted}:
            return True
        others = sorted(admitted - {wanted})
        if others:
            LOG.warning('Volume %(vol)s stays on %(src)s, reached over '
                        'iSCSI from %(dst)s: its export also admits '
                        '%(others)s (an attach elsewhere in progress, or a '
                        'leftover ACL of target %(iqn)s).',
                        {'vol': volume['id'], 'src': self.node_name,
                         'dst': connector['host'],
                         'others': ', '.join(others), 'iqn': target_iqn})
        else:
            LOG.warning('Volume %(vol)s stays on %(src)s, reached over '
                        'iSCSI from %(dst)s: the ACL of target %(iqn)s '
                        'cannot be read from configfs (%(root)s), so other '
                        'nodes using it cannot be ruled out.',
                        {'vol': volume['id'], 'src': self.node_name,
                         'dst': connector['host'], 'iqn': target_iqn,
                         'root': privileged.LIO_ISCSI})
        return False

    def connect_over_iscsi(self, volume, connector, connect):
        """``connect(volume, connector)`` for another node, under the lock.

        The ACL that admits that node is made under the volume's lock,
        as a move is: either the move sees the ACL and leaves the volume
        here (see :meth:`_admits_only`), or this attach sees the move and
        is refused.

        The ACL a move from here recorded it gave its destination
        (:data:`~cinder_dmclone.move.EXPORT_KEY`) goes first (see
        :meth:`drop_leftover_export`); if it cannot, the attach is
        refused: a later attempt to remove it could not tell it from one
        this attach relies on.  When this connector is that very
        destination (its initiator, the same string), the ACL is not
        removed but taken over: the record of it is forgotten, whatever
        the move's state, and the attach refused if it cannot be, for
        nothing to ever remove that ACL as a leftover.
        """
        with move.lock(volume['id']):
            self._give_up_stale_prepare(volume, connector)
            self.refuse_if_moving(volume,
                                  _('attaching on %s') % connector['host'])
            self._take_over_recorded_acl(volume, connector)
            return connect(volume, connector)

    def export_for_attach(self, volume, create, connector):
        """``create()`` the export an iSCSI attach from another node uses.

        Cinder's manager makes the export (create_export) before the
        connection (initialize_connection), which admits the attach's
        initiator: in between, the export admits nobody for it -- or
        only the ACL a move that is over left, which the monitor's tick
        removes.  The export is made under the volume's lock and the
        attach recorded as in flight (by ``connector``'s initiator) until
        :meth:`attach_done`: a tick, under the same lock, either removes
        the export before it is made (it is then made anew) or sees the
        attach and leaves the export to it (:meth:`_drop_emptied_export`).
        """
        with move.lock(volume['id']):
            info = create()
            self._prune_attaches(volume['id'])
            self.attaches_in_flight.setdefault(volume['id'], []).append(
                (_initiator(connector), self._clock()))
        return info

    def attach_done(self, volume, connector):
        """The connection of an attach made by export_for_attach is done.

        Made or failed: either its ACL is in place, or the manager
        removes the export next.  Its own entry goes (the oldest of its
        initiator), not another attach's; so do entries past their age
        (:meth:`_attach_in_flight`).  Also called by a migration, which
        makes the export as an attach does but connects nothing.
        """
        started = self.attaches_in_flight.get(volume['id'], [])
        initiator = _initiator(connector)
        for i, (who, _when) in enumerate(started):
            if who == initiator:
                del started[i]
                break
        self._prune_attaches(volume['id'])

    def _prune_attaches(self, volume_id):
        """Forget the volume's attaches in flight older than their window."""
        now = self._clock()
        window = self.stale_prepare_after()
        live = [(who, when) for who, when in
                self.attaches_in_flight.get(volume_id, ())
                if now - when <= window]
        if live:
            self.attaches_in_flight[volume_id] = live
        else:
            self.attaches_in_flight.pop(volume_id, None)

    def _attach_in_flight(self, volume_id):
        """True if an attach from another node may still be connecting.

        An attach whose connection never came (its manager died between
        the two calls, or Cinder's _connection_create failed after
        create_export) counts for as long as an attempt to move the
        volume may last (its connection may wait for the volume's lock
        that long): then the export is no longer kept for it, and its
        entry is forgotten.
        """
        self._prune_attaches(volume_id)
        return bool(self.attaches_in_flight.get(volume_id))

    def drop_migration_export(self, volume, connector, remove):
        """A migration did not move the volume: ``remove()`` its export.

        Under the volume's lock, and only if nothing else uses it.  The
        migration made the export as an attach does
        (:meth:`export_for_attach`, with its destination's ``connector``)
        while no lock kept other attaches away: an iSCSI attach from
        another node may have made it first or reused it since, and
        admits its own initiator.  What the migration gave is taken back
        (its destination's ACL, unless an attachment's connector names
        it); the export itself goes only if it
        then admits nobody and no iSCSI attach from another node is
        connecting to it (:meth:`_attach_in_flight`, the migration's own
        entry aside): whoever made it, nothing uses it.  An export that
        serves an attach stays, and the volume record keeps naming it:
        that attach's detach removes it.  A move from here that is still
        recorded keeps it too: its own end removes it.

        Returns None if ``remove()`` was called, else why the export
        stays, for the caller's refusal.  Raises if the migration's ACL
        cannot be removed.
        """
        with move.lock(volume['id']):
            if self.is_source(self.load(volume['id'])):
                return _('a move of it from %s is recorded') % self.node_name
            users = self._migration_export_users(volume, connector)
            if users:
                LOG.warning('Volume %(vol)s was not migrated to %(dst)s, and '
                            'the export made here for the migration stays: '
                            '%(users)s (an attach made while the migration '
                            'started). It goes with their detach.',
                            {'vol': volume['id'], 'dst': connector['host'],
                             'users': users})
                return users
            remove()
            return None

    def _migration_export_users(self, volume, connector):
        """What uses the export once a migration's own ACL is gone, or None.

        Under the volume's lock.  None also without an export to check
        (the record names none: ``remove()`` has nothing to do).  The
        migration's ACL stays too while an attachment in use names no
        initiator yet: Cinder saves an attach's connector only once it is
        connected, so the ACL may be that attach's (review 20, F1).
        """
        location = (volume.get('provider_location') or '').split(' ')
        if len(location) < 2:
            return None     # (nothing exported: nothing to keep)
        target_iqn = location[1]
        own = _initiator(connector)
        current = attachments.current(volume)
        if attachments.unnamed(volume, current):
            # (An attach in progress, whose connector Cinder saves only
            # once it is connected: it may be the destination node's,
            # whose initiator is the migration's.)
            return _('an attach to it is in progress')
        if own in self._lio_acls(target_iqn) and own not in \
                attachments.initiators(volume, current):
            self.target_driver.terminate_connection(
                volume, {'initiator': connector['initiator'], 'host': None})
        admitted = self._lio_acls(target_iqn)
        if admitted:
            return _('its export admits %s') % ', '.join(sorted(admitted))
        if self._attach_in_flight_besides(volume['id'], own):
            return _('an iSCSI attach from another node is connecting to '
                     'its export')
        return None

    def _attach_in_flight_besides(self, volume_id, own):
        """:meth:`_attach_in_flight`, one entry of initiator ``own`` aside."""
        self._prune_attaches(volume_id)
        started = [who for who, _when in
                   self.attaches_in_flight.get(volume_id, ())]
        if own in started:
            started.remove(own)
        return bool(started)

    def _drop_emptied_export(self, volume):
        """Remove an export that admits nobody now, under the volume's lock.

        Called once the ACL a move that is over gave is gone.  Not while
        an iSCSI attach from another node is connecting to the export
        (:meth:`export_for_attach`): it is that attach's, whose failure
        removes it (Cinder's manager removes the export when the
        connection fails).
        """
        if self._attach_in_flight(volume['id']):
            LOG.info('Volume %s: its export admits nobody now, but an '
                     'iSCSI attach from another node is connecting to it: '
                     'it stays.', volume['id'])
            return
        self.drop_and_forget_export(volume, ANY_INITIATOR)

    def _recorded_acl_is(self, volume, connector):
        """True if the ACL a move from here recorded is ``connector``'s."""
        recorded = self.store.move_export(self.ctxt(), volume['id'])
        wanted = (connector.get('initiator') or '').lower()
        return (recorded is not None and recorded[0] in self.node_names
                and bool(wanted) and recorded[1] == wanted)

    def _take_over_recorded_acl(self, volume, connector):
        """An attach admits the initiator a move's export gave: forget it.

        Under the volume's lock, before the ACL is made (a failed attach
        is cleaned up by its detach, which removes it).  Whatever the
        move's state: an ``aborted`` move lets other nodes attach, and
        ending it later removes the recorded ACL
        (:meth:`_drop_recorded_acl`), which is this attach's now.
        """
        try:
            if not self._recorded_acl_is(volume, connector):
                return
            LOG.info('Volume %(vol)s: %(host)s attaches over iSCSI with the '
                     'initiator its move\'s export admitted; that ACL is '
                     'now this attach\'s.',
                     {'vol': volume['id'], 'host': connector.get('host')})
            self.store.forget_move_export(self.ctxt(), volume['id'])
        except Exception:
            LOG.warning('Volume %s: could not forget the ACL its move\'s '
                        'export gave; refusing the attach.', volume['id'],
                        exc_info=True)
            raise exception.VolumeBackendAPIException(
                data=_('Volume %s: the record of an ACL of its export cannot '
                       'be updated now; try again.') % volume['id'])

    @staticmethod
    def _attaches_starting(volume):
        """Ids of the instance attachments being set up, read now.

        Read as an attach's move begins, before it waits for the volume's
        lock: Cinder reserved the attach's own attachment before it asked
        this node for the connection, so it is one of them.
        """
        return attachments.starting(volume, attachments.current(volume))

    def _refuse_if_attach_withdrawn(self, volume, asked, prepared=True):
        """Undo an attach's move if an attachment it may be for is gone.

        ``asked``: the instance attachments that were being set up when
        the attach began (:meth:`_attaches_starting`); None for a
        migration, which no attach asked for (an attachment reserved and
        deleted meanwhile is none of its concern: see
        :meth:`_may_be_used_here`).

        Nova gives up on an attach whose call timed out and deletes the
        attachment it reserved, while this node may still be waiting for
        the volume's lock or moving the volume for it.  Recording the
        move then would leave the volume on the destination with no
        instance using it (and, for a live migration, its source
        instance without its disk).  The driver is never told which
        attachment a connection is for, and an orphan (a reserved
        attachment that a failed ``attachment_create`` left, or that the
        owner made with no connector) looks just like the attach's own:
        if any of ``asked`` is gone, this attach may be the one
        withdrawn, and the move is given up (raised under the lock, like
        any failed prepare).  An owner deleting an orphan at that very
        moment costs one attempt, never a later one; an orphan that stays
        never passes for an attach that went.  ``prepared``: the
        destination answered already (else nothing was recorded yet).
        """
        if asked is None:
            return
        remaining = self._attaches_starting(volume)
        gone = sorted(asked - remaining)
        if asked and not gone:
            return
        LOG.warning('Volume %(vol)s stays on %(node)s: attachment(s) '
                    '%(ids)s, being set up when its attach on another node '
                    'began, were deleted since.',
                    {'vol': volume['id'], 'node': self.node_name,
                     'ids': ', '.join(str(i) for i in gone) or '(all)'})
        if prepared:
            why = _('was deleted while the move was prepared')
        else:
            why = _('was deleted before the move began')
        raise exception.VolumeBackendAPIException(
            data=_('An attachment of volume %(vol)s that this attach may '
                   'be for %(why)s (the attach timed out, or a reserved '
                   'attachment was deleted); the volume stays on %(node)s. '
                   'Attach it again.')
            % {'vol': volume['id'], 'why': why, 'node': self.node_name})

    @staticmethod
    def _check_source_size(volume, lv_sectors):
        """Refuse to move an LV smaller than its volume record says.

        The destination would build a clone of the LV's length under a
        volume of the record's size: the instance would see a disk whose
        tail is not the volume's.  Something shrank the LV by hand;
        nothing is moved or changed until an operator looks.
        """
        needed = int(volume['size']) * units.Gi // dmsetup.SECTOR_SIZE
        if lv_sectors < needed:
            raise exception.InvalidVolume(
                reason=_('the LV of volume %(vol)s holds %(has)d sectors, '
                         'its record says %(size)d GiB (%(need)d sectors); '
                         'refusing to move it. Check the LV on its node.')
                % {'vol': volume['id'], 'has': lv_sectors,
                   'size': int(volume['size']), 'need': needed})

    def _refuse_snapshots(self, ctxt, volume):
        snaps = objects.SnapshotList.get_all_for_volume(ctxt, volume['id'])
        if len(snaps):
            raise exception.InvalidVolume(
                reason=_('volume %(vol)s has %(n)d snapshot(s) on node '
                         '%(node)s; node-local snapshots cannot move with '
                         'it. Delete them, or attach the volume on '
                         '%(node)s.') % {'vol': volume['id'], 'n': len(snaps),
                                         'node': self.node_name})

    # -- ending a move that never committed --------------------------------

    def end_stale_prepare(self, volume):
        """Before an attach or a migration here: end a dead ``preparing``.

        Takes the volume's lock only when the record shows such a move
        (see :meth:`_give_up_stale_prepare`), or when this node's own
        mark contradicts the record (a stale save replaced the record of
        the move this node takes part in): it is then restored if this
        node is that move's destination, never given up.
        """
        t = self.load_any(volume['id'])
        if not (self._stale_prepare(volume, t) or self._restorable_here(
                self.contradiction(volume['id'], t))):
            return
        with move.lock(volume['id']):
            t = self._restored(volume, self.load_any(volume['id']))
            if self._stale_prepare(volume, t):
                self._give_up_stale_prepare(volume)

    def refuse_local_attach(self, volume, action):
        """Side.refuse_local_attach, once a dead ``preparing`` is ended.

        Also refused while a migration of the volume is being started
        here (:meth:`_migration_starting`).
        """
        self.end_stale_prepare(volume)
        if volume['id'] in self.migrations_starting:
            raise dmc_exception.MigrationStarting(
                volume_name=volume['id'], node=self.node_name, action=action)
        super().refuse_local_attach(volume, action)

    @contextlib.contextmanager
    def writing(self, volume, action):
        """Around a write to the volume here that no attachment shows.

        (An image written to it.)  Registered under the volume's lock,
        refused if a move is recorded: a move, which checks the writers
        under the lock (:meth:`_refuse_unless_movable`), either sees this
        one or was seen by it.
        """
        with move.lock(volume['id']):
            self.refuse_if_moving(volume, action)
            self.writers[volume['id']] += 1
        try:
            yield
        finally:
            self.writers[volume['id']] -= 1
            if self.writers[volume['id']] <= 0:
                del self.writers[volume['id']]

    def prepare_age(self, t):
        """Side.prepare_age: this node's wall clock against its own record.

        A move from here was recorded by this node, with its clock.
        """
        return self.store.prepare_age(t)

    def _stale_prepare(self, volume, t):
        """True for a move from here that no attempt will still record.

        One whose attempt failed here (whatever it left uncommitted: it
        goes before anything else here lets another node in to its
        export), or a ``preparing`` one older than any attempt.
        """
        if t is None or not (self.is_source(t) and self.lives_here(volume)):
            return False
        if self._ended_here(t):
            return t.state in move.UNCOMMITTED
        return t.state == move.PREPARING and self.prepare_outlived(t)

    def _give_up_stale_prepare(self, volume, connector=None):
        """Under the volume's lock: give up a move from here left preparing.

        An attempt holds the volume's lock from the moment it records a
        move until it records the outcome, and lasts at most the transfer
        timeout (plus a margin): a move from here still ``preparing``,
        older than that (:meth:`~cinder_dmclone.side.Side.prepare_outlived`)
        once the lock is ours, was left by an attempt that could not
        record how it ended (the database went
        away while the destination answered, or while the failure was
        cleaned up).  Nothing uses it: the volume record still names this
        node, the destination's clone was never handed to an instance.
        Left in place it would refuse every later attach as "moving"
        until this service restarts; it is given up instead, as the
        attempt itself would have done (the destination drops its side,
        the export made for it goes).  So is a move whose attempt this
        service saw fail, in whatever uncommitted state it was left
        (:meth:`_stale_prepare`).

        With no move recorded, the ACL of a move that is over goes first
        (:meth:`_drop_leftover_before_attach`); with ``connector`` (an
        iSCSI attach from another node), the attach is refused if it
        cannot.

        A record that this node's own mark contradicts is restored first
        if it can be (:meth:`_restored`); one that cannot is never given
        up (:meth:`give_up` refuses).
        """
        t = self._restored(volume, self.load_any(volume['id']))
        if t is None:
            self._drop_leftover_before_attach(volume, connector)
        if not self._stale_prepare(volume, t):
            return
        volume = objects.Volume.get_by_id(self.ctxt(), volume['id'])
        if not self._stale_prepare(volume, t):
            return
        LOG.warning('The move of volume %(vol)s to %(dst)s was left '
                    '%(state)s by an attempt that could not record its '
                    'outcome (was the database away?); giving it up.',
                    {'vol': volume['id'], 'dst': t.dest_node,
                     'state': t.state})
        self.give_up(self.ctxt(), volume, t, ANY_INITIATOR)

    def _restored(self, volume, t):
        """Record ``t``, or the one this node's destination side wrote back.

        Under the volume's lock.  When this node's own mark says it is the
        destination of another move than ``t`` (a stale whole save of
        the admin metadata replaced that move's record), that record is
        written back and rolled forward (:attr:`restore`), and read
        again.
        """
        if not self._restorable_here(self.contradiction(volume['id'], t)):
            return t
        if self.restore(volume, t) is None:
            return t
        return self.load_any(volume['id'])

    def _restorable_here(self, part):
        """True if ``part`` (a contradicting mark) is this node's to restore.

        Its destination side writes back the record of a move into this
        node (:attr:`restore`); a source never writes a record back.
        """
        return (part is not None and part.role == evidence.DESTINATION
                and self.restore is not None)

    def _drop_leftover_before_attach(self, volume, connector):
        """Before any ACL is made: drop the ACL of a move that is over.

        One made for this attach must never be taken for that leftover
        afterwards.  Not when ``connector`` is the destination that ACL
        admits (:meth:`_take_over_recorded_acl`).  If it cannot go, the
        monitor tries again; an iSCSI attach (``connector``) is refused
        then rather than let in next to an ACL nothing could tell apart.
        """
        try:
            if connector is not None and \
                    self._recorded_acl_is(volume, connector):
                return
            if self.drop_leftover_export(volume['id'], whole=False):
                return
            error = None
        except Exception as exc:
            error = exc
        self.leftover_exports.add(volume['id'])
        LOG.warning('Volume %s: could not remove the ACL of a move that is '
                    'over from its export; retrying at the next tick.',
                    volume['id'], exc_info=error is not None)
        if connector is not None:
            raise exception.VolumeBackendAPIException(
                data=_('Volume %(vol)s: the ACL its export keeps for a move '
                       'that is over cannot be removed now; refusing the '
                       'attach on %(host)s. Try again.')
                % {'vol': volume['id'], 'host': connector.get('host')})

    def give_up(self, ctxt, volume, t, connector=None, own_attempt=False):
        """End a move that never committed.

        The destination is asked first to remove its side, while the
        export it reads is still there: its logout from a target that is
        gone would wait out open-iscsi's replacement timeout (two
        minutes) inside the abort's call.  With ``connector`` (the one
        the move's export admits, or ANY_INITIATOR), the export made for
        the move goes next, once the record shows the move never
        committed (:meth:`_drop_export_unless_committed`; the destination
        refuses to abort a committed move).  The record goes last (a
        crash before leaves the move for recovery to abandon again):
        cleared if the destination confirmed it removed its side.  A
        destination that cannot be reached (dead mid-prepare) would
        otherwise keep its half-built clone, metadata LV and iSCSI
        session forever with nothing describing them: the move is kept
        as ``aborted`` for its recovery to clean up.

        Refused (MoveContradicted, nothing done) when this node's own
        mark names another move whose data is still here: a stale save
        set the record back to that earlier move, and the destination it
        names may hold the only whole copy of the volume.  Not for the
        attempt this call made itself (``own_attempt``), which recorded
        the move and marked it here.
        """
        if not own_attempt:
            self.refuse_if_contradicted(volume['id'], t,
                                        'giving the move up')
        aborted = self._abort_peer(ctxt, volume, t)
        if connector is not None:
            self._drop_export_unless_committed(volume, t, connector)
        self.end_part(volume['id'], t)
        if aborted:
            self.store.clear(ctxt, volume['id'], t)
        elif t.state != move.ABORTED:
            # (Never a committed move: MoveStateConflict then.)
            self.store.transition(ctxt, t, (move.PREPARING, move.CLONED),
                                  move.ABORTED)
            LOG.warning('Transfer of volume %(vol)s to %(dst)s aborted; '
                        '%(dst)s removes what it built when its service '
                        'is back.', {'vol': volume['id'],
                                     'dst': t.dest_node})
        if self._ended_here(t):
            del self.unrecorded[t.volume_id]

    def _drop_export_unless_committed(self, volume, t, connector):
        """Drop the export made for move ``t`` unless the move may stand.

        The record is read again first, under the volume's lock (only
        this node records the outcome of its own move).  A record that
        cannot be read leaves the outcome unknown, and a move recorded
        committed (its commit landed although its answer was lost)
        hydrates from this export: either keeps the export and raises
        (the database's error, or MoveStateConflict), for the caller to
        try again once the database tells.  A record of another move,
        or of none, leaves the export alone too: it is not this move's.
        Once the export is removed, a database that does not let it be
        forgotten does not stop the give-up (the record keeps naming it,
        for the next detach here to remove).

        An ``aborted`` move is not moving: other nodes may have been let
        in to the volume's target since (an iSCSI attach from a node
        without this backend).  The export made for it normally went
        when it was given up; only the ACL it gave the destination, if
        still recorded (:meth:`_drop_recorded_acl`), goes then, never
        the target another node uses.
        """
        current = self.load_any(volume['id'])
        if not t.same_move(current):
            return
        if current.state not in move.UNCOMMITTED:
            raise move.MoveStateConflict(
                volume_id=volume['id'], expected='/'.join(move.UNCOMMITTED),
                found=current.state)
        if current.state == move.ABORTED:
            self._drop_recorded_acl(volume, current)
            return
        try:
            self.drop_and_forget_export(volume, connector)
        except Exception:
            LOG.exception('Could not forget the export of volume %s made '
                          'for its move.', volume['id'])

    def drop_leftover_export(self, volume_id, whole=True, restore=False):
        """Under the volume's lock: drop the ACL a move that is over left.

        The source records, with each move, the ACL its export gives the
        destination (:data:`~cinder_dmclone.move.EXPORT_KEY`), and
        forgets it with the export.  Still recorded while no move is, for
        a volume that lives here: the move never committed (a committed
        move is cleared only once it finalized, and the volume then
        lives on its destination), yet its export still admits the
        destination.  So it goes when a failed attempt here could not
        give its move up (the database was away) and the destination
        ended it ('aborted') and cleared it meanwhile: after that, no
        step of the move would ever drop it.  Only the destination's ACL
        goes: another node may reach the volume through the same target
        (an iSCSI attach made since); the target goes too if it then
        admits nobody, with ``whole`` (not while an attach here has just
        made it: see :meth:`_give_up_stale_prepare` and
        :meth:`_drop_emptied_export`).  With ``restore``
        (at start) LIO's saved targets are restored first (a reboot
        left the ACL in LIO's saved configuration only); if the target
        the record names is still not in the kernel then (the restore
        failed), whether the saved configuration still admits that node
        is unknown, and Cinder's ``ensure_export`` may restore it next:
        the record of the ACL is kept, for the monitor to remove it once
        the target is back.  An ACL that a
        current attachment's connector names is left in place (see
        :meth:`_drop_acl`).

        Returns False if the ACL may still admit that node (the record
        of it is kept, for a later call); True otherwise.
        """
        ctxt = self.ctxt()
        try:
            recorded = self.store.move_export(ctxt, volume_id)
            if recorded is None:
                return True
            node, initiator = recorded
            if node not in self.node_names or \
                    self.load_any(volume_id) is not None:
                # (Another node's export; or the move's own steps drop it.)
                return True
            volume = objects.Volume.get_by_id(ctxt, volume_id)
        except exception.VolumeNotFound:
            return True
        if self.lives_here(volume) and not self._used_by_attachment(
                volume, initiator):
            LOG.warning('Volume %(vol)s: its move from here to the node of '
                        'initiator %(ini)s is over and never committed, but '
                        'its export still admits that node: removing its '
                        'ACL.', {'vol': volume_id, 'ini': initiator})
            if restore:
                self._restore_saved_exports(volume)
                if self._target_missing(volume):
                    LOG.warning('Volume %(vol)s: its export is not in the '
                                'kernel after LIO\'s saved configuration '
                                'was restored; the ACL of initiator %(ini)s '
                                'is removed once the export is back.',
                                {'vol': volume_id, 'ini': initiator})
                    return False
            if not self._drop_acl(volume, initiator, whole):
                return False
        self.store.forget_move_export(ctxt, volume_id)
        return True

    def _drop_unclaimed_acls(self, volume, t):
        """Ending an aborted move that recorded no ACL: drop its destination's.

        An aborted move recorded by an older release has no
        :data:`~cinder_dmclone.move.EXPORT_KEY`, yet its give-up may have
        kept the export made for it (the removal failed).  Its record
        names the destination node, not the initiator it admitted: that
        is known only from the connectors of the node's attachments
        (:func:`~cinder_dmclone.attachments.node_initiators`).  Only the
        ACLs of those initiators go, unless an attachment of this volume
        uses one, and the target if it then admits nobody: any other ACL
        may serve a connection no attachment records (cinder-backup's,
        Cinder's ``os-initialize_connection``).  With no initiator of
        the destination known, nothing goes: logged for an operator.
        Nothing goes either while an attachment in use names no
        initiator yet (an attach in progress).  Errors are logged: the
        export then stays as before this release.
        """
        location = (volume.get('provider_location') or '').split(' ')
        if len(location) < 2:
            LOG.info('Volume %s: the export made for its aborted move is '
                     'gone already.', volume['id'])
            return
        target_iqn = t.target_iqn or location[1]
        try:
            current = attachments.current(volume)
            if attachments.unnamed(volume, current):
                LOG.warning('Volume %s: its aborted move recorded no ACL '
                            '(an older release) and an attach is in '
                            'progress; its export is left in place.',
                            volume['id'])
                return
            admitted = self._lio_acls(target_iqn)
            dest = attachments.node_initiators(t.dest_node)
            claimed = attachments.initiators(volume, current)
            if not dest and admitted:
                LOG.warning('Volume %(vol)s: its aborted move to %(dst)s, '
                            'recorded by an older release, did not record '
                            'the ACL it gave, and no attachment on %(dst)s '
                            'tells its initiator: the ACLs of target '
                            '%(iqn)s (%(acls)s) are left in place. Remove '
                            "the one of %(dst)s's initiator by hand "
                            '(cinder-rtstool delete-initiator).',
                            {'vol': volume['id'], 'dst': t.dest_node,
                             'iqn': target_iqn,
                             'acls': ', '.join(sorted(admitted))})
                return
            for initiator in sorted((admitted & dest) - claimed):
                LOG.warning('Volume %(vol)s: removing the ACL of initiator '
                            '%(ini)s (%(dst)s\'s) from its export as its '
                            'aborted move to %(dst)s ends (recorded by an '
                            'older release).',
                            {'vol': volume['id'], 'ini': initiator,
                             'dst': t.dest_node})
                self.target_driver.terminate_connection(
                    volume, {'initiator': initiator, 'host': None})
            if admitted and not self._lio_acls(target_iqn):
                self._drop_emptied_export(volume)
        except Exception:
            LOG.exception('Volume %(vol)s: could not remove the ACL of '
                          '%(dst)s from its export.',
                          {'vol': volume['id'], 'dst': t.dest_node})

    def _target_missing(self, volume):
        """True if the record names a target that the kernel does not hold."""
        location = (volume.get('provider_location') or '').split(' ')
        return len(location) >= 2 and not self._lio_target_exists(
            location[1])

    @staticmethod
    def _used_by_attachment(volume, initiator):
        """True if an attachment of the volume uses ``initiator``'s ACL.

        The connector of one of its attachments (reserved, attaching or
        attached) names it: the move's destination attached the volume
        over iSCSI since (a multiattach volume) with the same initiator,
        and the ACL is that attachment's now, for its detach to remove.
        """
        if initiator not in attachments.initiators(
                volume, attachments.current(volume)):
            return False
        LOG.info('Volume %(vol)s: initiator %(ini)s, which its export '
                 'admitted for a move that is over, is an attachment\'s '
                 'now; its ACL stays.',
                 {'vol': volume['id'], 'ini': initiator})
        return True

    def _drop_recorded_acl(self, volume, t):
        """Remove the ACL aborted move ``t`` recorded it gave; then forget it.

        The target goes too if it then admits nobody.  An ACL that an
        attachment uses (:meth:`_used_by_attachment`) stays, and the
        record of it is forgotten.  Nothing recorded: the export made
        for the move is gone already (or an attach took the ACL over),
        or the move was recorded by an older release, which did not
        record that ACL (no :data:`~cinder_dmclone.move.EXPORT_RECORDED`
        key: :meth:`_drop_unclaimed_acls`).
        """
        ctxt = self.ctxt()
        recorded = self.store.move_export(ctxt, volume['id'])
        if recorded is None:
            if not self.store.export_recorded(ctxt, volume['id']):
                self._drop_unclaimed_acls(volume, t)
                return
            LOG.info('Volume %s: the export made for its aborted move is '
                     'gone already (or an attach took its ACL over); its '
                     'export now, if any, is left in place.', volume['id'])
            return
        if recorded[0] not in self.node_names:
            LOG.info('Volume %s: the export made for its aborted move is '
                     'not this node\'s; its export now, if any, is left in '
                     'place.', volume['id'])
            return
        if self._used_by_attachment(volume, recorded[1]) or \
                self._drop_acl(volume, recorded[1], True, t.target_iqn):
            self.store.forget_move_export(ctxt, volume['id'])

    def _drop_acl(self, volume, initiator, whole, target_iqn=None):
        """Remove one initiator from the volume's target; True if gone.

        With ``whole``, the target too if it then admits nobody (and the
        record stops naming it).  Raises if the ACL cannot be removed.
        """
        location = (volume.get('provider_location') or '').split(' ')
        if len(location) < 2:
            # (Cinder's target drivers keep no export the record does
            # not name.)
            return True
        target_iqn = target_iqn or location[1]
        if initiator in self._lio_acls(target_iqn):
            self.target_driver.terminate_connection(
                volume, {'initiator': initiator, 'host': None})
        admitted = self._lio_acls(target_iqn)
        if initiator in admitted:
            return False
        if whole and not admitted:
            self._drop_emptied_export(volume)
        return True

    def _abort_peer(self, ctxt, volume, t):
        """Ask the destination to remove its side; True if it did."""
        try:
            self.send(ctxt, volume, t, t.dest_host, peer.ABORT)
        except Exception:
            LOG.exception('Destination %s could not abort.', t.dest_node)
            return False
        return True

    def drop_export(self, volume, connector):
        """Remove the export made for a move; never raise.

        Returns True if it was removed.
        """
        try:
            self.target_driver.terminate_connection(volume, connector)
            self.target_driver.remove_export(self.ctxt(), volume)
        except Exception:
            LOG.exception('Could not remove the export of volume %s made '
                          'for its transfer.', volume['id'])
            return False
        return True

    def drop_and_forget_export(self, volume, connector):
        """Remove the export of a move that ended here, and forget it.

        Once the export is gone the volume record must stop naming it.  A
        detach of the destination's attachment can still reach this node
        afterwards (Nova retries one that failed while the destination's
        service was down, after that service's recovery finished the
        rollback; or it cleans up the attachment of a failed attach): the
        target driver would then remove the destination's initiator from
        a target that no longer exists, which LIO refuses
        (``cinder-rtstool delete-initiator``: "Could not find target"),
        and the attachment could never be deleted.  Without a
        ``provider_location`` the target driver has nothing to do.  If the
        removal failed, the record keeps naming the export, so that the
        next detach here removes it.
        """
        if self.drop_export(volume, connector):
            self.store.forget_source_export(self.ctxt(), volume['id'])

    def export_again(self, volume, t):
        """After a start: the export the destination still reads from.

        A reboot of this node took LIO's targets and the volume's handle,
        and Cinder's start calls ``ensure_export`` only for the volumes
        whose record names this node, which a moved volume's no longer
        does.  Until the destination retires this copy it reads every
        region it has not copied from here, so the handle is rebuilt
        and LIO's saved configuration restored (its target and the
        destination's ACL and CHAP credentials were saved with them).
        """
        if self._ensure_export is None:
            return
        LOG.info('Volume %(vol)s is moving to %(dst)s (%(state)s): '
                 'making sure its export here is in place.',
                 {'vol': volume['id'], 'dst': t.dest_node,
                  'state': t.state})
        self._ensure_export(volume)

    def read_by_committed_move(self, volume, t):
        """True if move ``t`` from here committed and still reads from here.

        Read from Cinder's columns, which no save of the admin metadata
        and no volume owner writes: the volume record names ``t``'s
        destination (the source writes it only once it committed the
        move: Side.names_destination) and still names ``t``'s export
        here as its location (a finalization forgets it once this copy
        is retired: Side.names_source_export).  So never a move that
        finished, nor one rolled back or given up.
        """
        return (self.names_destination(volume, t)
                and self.names_source_export(volume, t))

    def export_by_mark(self, volume, t):
        """After a start: export again what this node's mark says is read.

        ``t`` is the volume's record now (None: none), which this node's
        own mark contradicts: a stale whole save removed or replaced the
        record of the move from here, whose destination still reads
        every region it has not copied from this node's copy, and a
        reboot took the export.  Only for this node's mark as that
        move's source, its copy still here (Evidence.live), and the move
        committed and not finished (:meth:`read_by_committed_move`).
        Returns True if the export was made again.
        """
        part = self.contradiction(volume['id'], t)
        if part is None or part.role != evidence.SOURCE or \
                not self.read_by_committed_move(volume, part.move):
            return False
        LOG.warning('Volume %(vol)s: its move record (%(record)s) does not '
                    'name the move from here that this node\'s own mark '
                    'names (the %(part)s, committed); its destination '
                    'reads from the copy here, whose export is made '
                    'again.', {'vol': volume['id'],
                               'record': side.describe_record(t),
                               'part': part.describe()})
        self.export_again(volume, part.move)
        return True

    def _restore_saved_exports(self, volume):
        """Bring back LIO's saved targets before an export is removed.

        After a reboot the kernel has no target, but LIO's saved
        configuration still holds the export made for the move (with the
        destination's ACL): removing it from the kernel fails, the saved
        copy stays, and the start's first ``ensure_export`` would restore
        it, leaving the destination admitted to a volume that stayed
        here.  Restored first (the handles with it), it is removed from
        both.  Never raises: the removal then fails and logs as before.
        """
        if self._ensure_export is None:
            return
        try:
            self._ensure_export(volume)
        except Exception:
            LOG.warning('Could not restore the saved exports before '
                        'removing the one of volume %s.', volume['id'],
                        exc_info=True)

    def give_up_aborted(self, volume):
        """Before a delete here: end a move from here that never committed.

        A move left ``preparing`` by an attempt here that failed (or one
        outlived, :meth:`end_stale_prepare`) is given up first: its
        destination may hold a clone hydrated with the volume's data,
        which nothing would remove once the volume is gone.  Then an
        ``aborted`` one: the destination is asked once more to remove
        what it built; if it still cannot, its own recovery does (the
        record stays).
        """
        self.end_stale_prepare(volume)
        t = self.load_any(volume['id'])
        if t is None or t.state != move.ABORTED or not self.is_source(t):
            return
        with move.lock(volume['id']):
            t = self.load_any(volume['id'])
            if t is not None and t.state == move.ABORTED and \
                    self.is_source(t):
                self.give_up(self.ctxt(), volume, t)

    def half_rolled_back(self, volume, t):
        """True for a move in ``cloned`` whose record names us again.

        The destination points the record back at the source in the
        middle of its rollback; a crash there leaves the state behind on
        a volume that no longer moves, and the destination's recovery no
        longer sees it (nothing of it is left there).  The source sees it
        at the next detach (Nova retries the one that failed) or restart.
        """
        return (self.is_source(t) and t.state == move.CLONED
                and self.lives_here(volume))

    def lives_here(self, volume):
        """True if the volume record names this node."""
        return volume_utils.extract_host(volume['host'], 'host') in \
            self.node_names

    def finish_rollback(self, volume):
        """At a detach here: finish a rollback its destination cut short.

        Not for a record this node's own mark contradicts (kept, logged:
        :meth:`give_up` refuses it); the detach itself goes on.
        """
        if not self.half_rolled_back(volume, self.load(volume['id'])):
            return
        with move.lock(volume['id']):
            # The caller's volume object may predate the move (cinder-api
            # loads it before its RPC): only the record as it is now,
            # under the lock, says whether the volume lives here again.
            volume = objects.Volume.get_by_id(self.ctxt(), volume['id'])
            t = self.load(volume['id'])
            if self.half_rolled_back(volume, t):
                LOG.warning('Finishing the rollback of the move of volume '
                            '%(vol)s to %(dst)s that its destination did not '
                            'complete.', {'vol': volume['id'],
                                          'dst': t.dest_node})
                try:
                    self.give_up(self.ctxt(), volume, t)
                except dmc_exception.MoveContradicted:
                    return      # (kept, logged: the detach goes on)

    def abandon(self, volume, t):
        """Recovery: a move from here that never completed.

        The source crashed before the move was committed, or gave it up
        while the destination was unreachable.  Given up with the export
        made for it, as a failed attempt is (see :meth:`give_up`).
        """
        LOG.warning('Transfer of volume %s never completed; asking %s to '
                    'drop its side.', volume.id, t.dest_node)
        self._restore_saved_exports(volume)
        self.give_up(self.ctxt(), volume, t, ANY_INITIATOR)

    # -- steps the destination asks for ------------------------------------

    def confirm_closed(self, volume, t):
        """Return once no instance here holds the volume; else refuse.

        The destination asks before it commits on the source's detach.
        Nova closes the source's copy before it deletes the source's
        attachment (the instance has left this node); an attachment
        deleted through the API while the instance still runs here is not
        that, and committing then would hydrate the destination from a
        copy that still changes, then retire it: every write made here
        after the commit would be lost.  The handle's only expected opener
        is LIO, exporting it to the destination.  A handle that is gone
        has no user.  The handle is named after the LV the move records
        (``t``, checked with the step), not after the request's volume.
        """
        name = layout.handle_name(self.volume_group, t.lv_name)
        deadline = self._clock() + self.CLOSE_WAIT
        while True:
            users = self._users(name)
            if users <= 0:
                return
            if self._clock() >= deadline:
                LOG.error('Volume %(vol)s is still open here (%(n)d '
                          'user(s) besides LIO): refusing to let its move '
                          'commit.', {'vol': volume['id'], 'n': users})
                raise dmc_exception.SourceStillInUse(
                    volume=volume['id'], node=self.node_name, users=users)
            self._sleep(self.CLOSE_POLL)

    def _users(self, name):
        """Openers of handle ``name`` other than LIO's backstores."""
        try:
            count = self.dm.open_count(name)
        except dmc_exception.DMDeviceNotFound:
            return 0
        return count - self._lio_openers(dmsetup.device_path(name))

    def release(self, volume, connector, t=None):
        """A rollback is done: drop the export made for the move ``t``."""
        self.drop_and_forget_export(volume, connector)
        self.end_part(volume['id'], t)

    def retire(self, volume, connector, t=None, deleting=False):
        """The volume has left with move ``t``: drop its export, handle, LV.

        Never while this node's own mark names another move whose data is
        still here (MoveContradicted): the copy here may be what that
        move reads.  Unless the volume is being deleted (``deleting``:
        peer.Endpoint.deleting): then no move is to survive, and this
        node's mark goes whatever move it names.
        """
        if self.lives_here(volume):
            raise exception.VolumeBackendAPIException(
                data=_('Refusing to retire volume %s: its record still '
                       'names this node.') % volume['id'])
        if not deleting:
            self.refuse_if_contradicted(volume['id'], t,
                                        'retiring the copy here')
        self.drop_export(volume, connector)
        self.dm.remove(layout.handle_name(self.volume_group, volume['name']))
        self.wiper.discard(volume['name'])
        if deleting:
            self.end_every_part(volume['id'])
        else:
            self.end_part(volume['id'], t)
        LOG.info('Old copy of volume %s removed from this node.',
                 volume['id'])
