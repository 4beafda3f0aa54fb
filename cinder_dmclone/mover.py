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

"""What a transfer means in Cinder's terms, on either end.

The :class:`Mover` runs in every node's volume service.  On the *source*
(the node the volume lives on) it starts a move when an instance on another
node attaches the volume, and serves the steps the destination asks of it
(release or retire the export and old LV).  On the *destination* it builds
the clone, commits or rolls back when live migration ends, finalizes
finished clones for the monitor, and recovers transfers at service start.

Every entry point that changes a transfer takes the volume's coordination
lock, except the steps one node runs on behalf of the other: those execute
inside the caller's critical section (taking the lock there would deadlock
on a distributed lock).
"""

from oslo_concurrency import lockutils
from oslo_log import log as logging
from oslo_utils import excutils
from oslo_utils import units

from cinder.common import constants
from cinder import context
from cinder import coordination
from cinder import exception
from cinder.i18n import _
from cinder import objects
from cinder.objects import fields
from cinder.volume import volume_utils

from cinder_dmclone import dmsetup
from cinder_dmclone import exception as dmc_exception
from cinder_dmclone import layout
from cinder_dmclone import peer
from cinder_dmclone import transfer

LOG = logging.getLogger(__name__)

#: attach statuses of an attachment that is being set up right now.
_STARTING = (fields.VolumeAttachStatus.RESERVED,
             fields.VolumeAttachStatus.ATTACHING)
_ACTIVE = (fields.VolumeAttachStatus.ATTACHED,
           fields.VolumeAttachStatus.ATTACHING)


def lock(volume_id):
    """The per-volume lock every transfer step runs under."""
    return coordination.COORDINATOR.get_lock('dmclone-%s' % volume_id)


def build_lock(volume_id):
    """This node's lock on building or removing a volume's clone.

    The destination builds a clone inside the source's critical section
    (it holds the volume lock while it waits), and a source that gave up
    waiting asks it to abort in the same way: the two steps may then run
    at once in this service.  This process-local lock makes the abort wait
    for the build, so it removes everything the build made.
    """
    return lockutils.lock('dmclone-build-%s' % volume_id)


def is_instance_attach(volume, attachments=None):
    """True if an instance attachment of the volume is being set up.

    Only instances move volumes: cinder-backup, image upload and other
    attaches without an instance get an ordinary iSCSI export.
    ``attachments`` defaults to the ones the volume object carries.
    """
    if attachments is None:
        attachments = volume.volume_attachment or []
    return any(a.instance_uuid and a.attach_status in _STARTING
               for a in attachments)


def attachments_on(volume, node, attachments=None):
    """Active attachments of the volume on ``node`` (a name or a set)."""
    names = {node} if isinstance(node, str) else set(node)
    if attachments is None:
        attachments = volume.volume_attachment or []
    count = 0
    for a in attachments:
        if a.attach_status not in _ACTIVE:
            continue
        host = a.attached_host or (a.connector or {}).get('host')
        if host in names:
            count += 1
    return count


class Mover(object):
    """Transfers seen from one node.

    ``node`` is the node's identity (its connector host names, service
    host), the rest are its tools: the transfer Store, the PeerClient, the
    node's DestinationNode factory, the target driver and callables for the
    handle operations the driver owns.
    """

    def __init__(self, node_names, node_name, store, peer_client,
                 destination, target_driver, retire_local, region_sectors,
                 tuning, own_connector, stall_timeout=0):
        self.node_names = node_names
        self.node_name = node_name
        self.store = store
        self.peer = peer_client
        self.destination = destination
        self.target_driver = target_driver
        self.retire_local = retire_local
        self.region_sectors = region_sectors
        self.tuning = tuning
        self.own_connector = own_connector
        self.pending_finalize = set()
        #: the last progress the monitor saw, per volume moving here.
        self.progress = {}
        #: seconds without hydration progress before it is reported; 0: off.
        self.stall_timeout = stall_timeout
        #: volumes moving here whose stall has been reported.
        self.stalled = set()
        #: volumes kept in ``cloned`` after writes here (see _hold).
        self.held = set()
        #: clone targets here that no transfer describes (reported once).
        self.orphans = set()
        #: LV name -> volume id of the moves into this node: an LV is not
        #: always named after its volume (a migrated volume's _name_id).
        self.lv_volumes = {}

    # -- helpers ---------------------------------------------------------

    @staticmethod
    def ctxt():
        return context.get_admin_context()

    def is_dest(self, t):
        return t is not None and t.dest_node in self.node_names

    def is_source(self, t):
        return t is not None and t.source_node in self.node_names

    def attachments(self, volume):
        """The volume's attachments as the database holds them now.

        The Volume object a manager hands over can predate the attachment
        being set up: Cinder's attachment create with a connector (what
        Nova does for the destination of a live migration) reserves the
        attachment after it loaded the volume.
        """
        return objects.VolumeAttachmentList.get_all_by_volume_id(
            self.ctxt(), volume['id'])

    def load(self, volume_id):
        """The volume's transfer in progress, or None.

        An ``aborted`` transfer is not in progress: the volume is back to
        normal on its source, only leftovers on the destination remain
        (see :meth:`load_any`).
        """
        t = self.load_any(volume_id)
        return None if t is None or t.state == transfer.ABORTED else t

    def load_any(self, volume_id):
        """The volume's transfer state, aborted ones included."""
        return self.store.load(self.ctxt(), volume_id)

    def refuse_if_moving(self, volume, action, locked=False):
        """Raise TransferInProgress if the volume is being moved.

        With ``locked``, a move being set up right now (the source holds
        the lock while the destination builds) is waited for and seen.
        """
        t = self.load(volume['id'])
        if t is not None and locked:
            with lock(volume['id']):
                t = self.load(volume['id'])
        if t is not None:
            md = self.store.db.volume_admin_metadata_get(self.ctxt(),
                                                         volume['id'])
            raise transfer.TransferInProgress(
                volume_name=volume['name'], source=t.source_node,
                dest=t.dest_node, state=t.state,
                percent=transfer.progress_percent(md), action=action)

    def destination_host(self, ctxt, volume, node):
        """The volume host string and AZ of ``node``'s service, or None.

        A node's service runs the same backend section under the node's
        name (``<node>@<section>``); the pool is the backend name.
        """
        backend = volume_utils.extract_host(volume['host'], 'backend')
        section = backend.partition('@')[2]
        dest_backend = '%s@%s' % (node, section)
        try:
            service = objects.Service.get_by_args(ctxt, dest_backend,
                                                  constants.VOLUME_BINARY)
        except exception.ServiceNotFound:
            return None, None
        if service.disabled or not service.is_up:
            raise exception.VolumeBackendAPIException(
                data=_('Cannot move volume %(vol)s to node %(node)s: its '
                       'volume service %(svc)s is down or disabled.')
                % {'vol': volume['id'], 'node': node, 'svc': dest_backend})
        pool = volume_utils.extract_host(volume['host'], 'pool')
        return (volume_utils.append_host(dest_backend, pool),
                service.availability_zone)

    @staticmethod
    def host_zone(ctxt, host):
        """The availability zone of the volume service behind ``host``.

        None when the service is unknown: the record keeps its zone.
        """
        backend = volume_utils.extract_host(host, 'backend')
        try:
            return objects.Service.get_by_args(
                ctxt, backend, constants.VOLUME_BINARY).availability_zone
        except exception.ServiceNotFound:
            return None

    # -- source: starting a move -----------------------------------------

    def wants_move(self, volume, connector):
        """True if this attach should move the volume to the connector.

        A multiattach volume never moves: each node's copy would take its
        own writes, so instances on two nodes would see two disks.  It
        stays where it is and other nodes reach it over iSCSI.
        """
        if volume.get('multiattach'):
            return False
        return (connector.get('host') not in self.node_names
                and is_instance_attach(volume, self.attachments(volume)))

    def move(self, volume, connector, lv_sectors):
        """Move ``volume`` to the connector's node; return conn info.

        Runs on the source, inside the attach request.  The destination's
        service builds the clone over this node's export (ACL for its
        initiator only) and returns a local connection; the volume record
        then names the destination.  Any failure leaves the volume here,
        untouched, with nothing left on either node.
        """
        ctxt = self.ctxt()
        dest_node = connector['host']
        self._check_source_size(volume, lv_sectors)
        with lock(volume['id']):
            self.refuse_if_moving(volume, _('attaching on %s') % dest_node)
            self._refuse_snapshots(ctxt, volume)
            dest_host, dest_az = self.destination_host(ctxt, volume,
                                                       dest_node)
            if dest_host is None:
                return None
            iscsi = self.target_driver.initialize_connection(volume,
                                                             connector)
            data = iscsi['data']
            t = transfer.Transfer(
                volume_id=volume['id'], lv_name=volume['name'],
                state=transfer.PREPARING, source_host=volume['host'],
                dest_host=dest_host, source_node=self.node_name,
                dest_node=dest_node, region_sectors=self.region_sectors,
                clone_sectors=lv_sectors,
                target_portal=data['target_portal'],
                target_iqn=data['target_iqn'],
                target_lun=data.get('target_lun', 0),
                source_aliases=tuple(sorted(
                    self.node_names - {self.node_name})))
            current = self.attachments(volume)
            # Any name of this node: an attachment made under an alias
            # still writes to the source, so it must not be hydrated yet.
            hydrate = not attachments_on(volume, self.node_names, current)
            starting = self._starting_attachments(current)
            LOG.info('Moving volume %(vol)s from %(src)s to %(dst)s '
                     '(hydration %(h)s).',
                     {'vol': volume['id'], 'src': self.node_name,
                      'dst': dest_node,
                      'h': 'now' if hydrate else 'after detach here'})
            self.store.save(ctxt, t)
            try:
                info = self.peer.prepare(ctxt, volume, dest_host, connector,
                                         t.secret, hydrate=hydrate,
                                         size_gb=volume['size'])
                self._refuse_if_attach_withdrawn(volume, starting)
                # Only the lock holder writes the state: the destination
                # answered, the move is recorded here, under the lock.
                self.store.transition(
                    ctxt, t, (transfer.PREPARING,),
                    transfer.HYDRATING if hydrate else transfer.CLONED)
            except Exception:
                with excutils.save_and_reraise_exception():
                    LOG.error('Destination %(dst)s could not take volume '
                              '%(vol)s; it stays on %(src)s.',
                              {'dst': dest_node, 'vol': volume['id'],
                               'src': self.node_name})
                    # The destination may have built (part of) the clone
                    # before failing to answer (a timeout, a restart):
                    # ask it to drop its side while the state still
                    # describes the transfer.
                    self._drop_export(volume, connector)
                    self._give_up(ctxt, volume, t)
            self.store.move_volume(ctxt, volume['id'], dest_host, dest_az)
            LOG.info('Volume %(vol)s now lives on %(dst)s.',
                     {'vol': volume['id'], 'dst': dest_host})
            return info

    @staticmethod
    def _starting_attachments(attachments):
        return {a.id for a in attachments
                if a.instance_uuid and a.attach_status in _STARTING}

    def _refuse_if_attach_withdrawn(self, volume, starting):
        """Undo a move whose attach was withdrawn while it was built.

        Nova gives up on an attach whose call timed out and deletes the
        attachment it reserved, while this node may still be moving the
        volume for it.  Recording the move then would leave the volume
        on the destination with no instance using it (and, for a live
        migration, its source instance without its disk): the move is
        given up instead, like any failed prepare.
        """
        remaining = self._starting_attachments(self.attachments(volume))
        if starting and not starting & remaining:
            raise exception.VolumeBackendAPIException(
                data=_('The attachment that moved volume %s was deleted '
                       'while the move was prepared (the attach timed '
                       'out?); the move is given up.') % volume['id'])

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

    def _request(self, ctxt, volume, t, host, op):
        """Send step ``op`` of move ``t`` to ``host``'s service.

        The caller holds the volume's lock: a move recorded by release
        1.1.0 gets its secret here, before the other node needs it.
        """
        self.store.ensure_secret(ctxt, t)
        self.peer.request(ctxt, volume, host, self.own_connector(), op,
                          t.secret)

    def _abort_peer(self, ctxt, volume, t):
        """Ask the destination to remove its side; True if it did."""
        try:
            self._request(ctxt, volume, t, t.dest_host, peer.ABORT)
        except Exception:
            LOG.exception('Destination %s could not abort.', t.dest_node)
            return False
        return True

    def _give_up(self, ctxt, volume, t):
        """End a move that never committed, from the source.

        The state goes once the destination confirmed it removed its
        side.  A destination that cannot be reached (dead mid-prepare)
        would otherwise keep its half-built clone, metadata LV and iSCSI
        session forever with nothing describing them: the transfer is
        kept as ``aborted`` for its recovery to clean up.
        """
        if self._abort_peer(ctxt, volume, t):
            self.store.clear(ctxt, volume['id'], t)
        elif t.state != transfer.ABORTED:
            self.store.transition(ctxt, t, transfer.STATES, transfer.ABORTED)
            LOG.warning('Transfer of volume %(vol)s to %(dst)s aborted; '
                        '%(dst)s removes what it built when its service '
                        'is back.', {'vol': volume['id'],
                                     'dst': t.dest_node})

    def _drop_export(self, volume, connector):
        try:
            self.target_driver.terminate_connection(volume, connector)
            self.target_driver.remove_export(self.ctxt(), volume)
        except Exception:
            LOG.exception('Could not remove the export of volume %s made '
                          'for its transfer.', volume['id'])

    # -- source: steps asked by the destination --------------------------

    def authenticate(self, volume, step):
        """The transfer a node-to-node step belongs to, or StepRefused.

        A step must carry the secret of the transfer it acts on, and its
        operation must fit this node's side of it.  Anything else came
        through the public API (an owner's connector with a ``dmclone``
        entry) and changes nothing.
        """
        op = step.get('op')
        t = self.load_any(volume['id'])
        reason = None
        if t is None:
            reason = 'no transfer of this volume is recorded'
        elif not t.authentic(step.get('secret')):
            reason = 'it does not carry the transfer\'s secret'
        elif op in (peer.PREPARE, peer.ABORT) and not self.is_dest(t):
            reason = 'this node is not the destination'
        elif op in (peer.RELEASE, peer.RETIRE) and not self.is_source(t):
            reason = 'this node is not the source'
        if reason:
            LOG.warning('Refused dmclone step %(op)s for volume %(vol)s: '
                        '%(why)s (a request through the public API?).',
                        {'op': op, 'vol': volume['id'], 'why': reason})
            raise dmc_exception.StepRefused(op=op, volume=volume['id'],
                                            reason=reason)
        return t

    def serve(self, volume, connector, step):
        """Run a step the other node asked for (no lock: see module doc)."""
        self.authenticate(volume, step)
        op = step['op']
        if op == peer.RELEASE:
            self._drop_export(volume, connector)
        elif op == peer.RETIRE:
            self._retire(volume, connector)
        elif op == peer.ABORT:
            self._abort_destination(volume, step)

    def _retire(self, volume, connector):
        """The volume has left: drop its export, handle and old LV."""
        if volume_utils.extract_host(volume['host'], 'host') in \
                self.node_names:
            raise exception.VolumeBackendAPIException(
                data=_('Refusing to retire volume %s: its record still '
                       'names this node.') % volume['id'])
        self._drop_export(volume, connector)
        self.retire_local(volume)
        LOG.info('Old copy of volume %s removed from this node.',
                 volume['id'])

    def _abort_destination(self, volume, step):
        """Remove what this node built for a move the source gave up.

        Only if the record still describes that move once the build lock
        is ours: the abort may have waited for a build, and meanwhile the
        move been given up for good and a later move of the volume built
        here.  (A move is aborted only by the source that gave it up, so
        its secret alone tells it apart.)
        """
        with build_lock(volume['id']):
            t = self.load_any(volume['id'])
            if t is not None and t.authentic(step.get('secret')):
                self.destination().tear_down(t, volume['provider_auth'])
            else:
                LOG.warning('Abort of an earlier move of volume %s ignored: '
                            'the record describes another move now.',
                            volume['id'])

    def _drop_aborted(self, volume, t):
        """Destination: remove what an aborted transfer built here."""
        LOG.warning('Transfer of volume %(vol)s from %(src)s was aborted; '
                    'removing what was built here.',
                    {'vol': volume['id'], 'src': t.source_node})
        self.destination().tear_down(t, volume['provider_auth'])
        self.store.clear(self.ctxt(), volume['id'], t)

    # -- destination -----------------------------------------------------

    def prepare(self, volume, step):
        """Build the clone of a volume moving here; return its path.

        The source records the outcome (it holds the volume's lock while
        it waits for this answer): nothing here writes the state.
        """
        self.authenticate(volume, step)
        with build_lock(volume['id']):
            # Checked again once the lock is ours: while this step waited,
            # its move may have been given up and a later one built.
            t = self.authenticate(volume, step)
            if t.state != transfer.PREPARING:
                raise exception.VolumeBackendAPIException(
                    data=_('No transfer of volume %s to this node is being '
                           'prepared.') % volume['id'])
            return self._build(volume, step, t)

    def _build(self, volume, step, t):
        self.lv_volumes[t.lv_name] = volume['id']
        dest = self.destination()
        hydrate = bool(step.get('hydrate'))
        threshold, batch = self.tuning(volume.volume_type)
        size_gb = int(step.get('size_gb') or volume['size'])
        try:
            # Anything here is left from an earlier attempt that was given
            # up (the source timed out and cleared its state): never reuse
            # a clone or metadata LV whose regions may hold stale data.
            dest.tear_down(t, volume['provider_auth'])
            dest.check_space(t, size_gb, self.node_name)
            dest.create_volumes(t, size_gb)
            source = dest.connect_source(t, volume['provider_auth'])
            path = dest.build_clone(t, source, hydrate, threshold, batch)
        except Exception:
            with excutils.save_and_reraise_exception():
                LOG.exception('Building the clone of volume %s failed; '
                              'removing what was built.', volume['id'])
                dest.tear_down(t, volume['provider_auth'])
        self._refuse_if_given_up(volume, t)
        LOG.info('Clone of volume %(vol)s built over %(src)s (hydration '
                 '%(h)s).', {'vol': volume['id'], 'src': t.source_node,
                             'h': 'on' if hydrate else 'off'})
        return path

    def _refuse_if_given_up(self, volume, t):
        """Before answering: is the source still waiting for this move?

        A build that outlasted the source's transfer timeout (a network
        cut during the login) finishes after the source gave up and
        recorded the move ``aborted``, or cleared it (or a later move
        replaced it): nobody will attach to this clone, so it goes now.
        The source records the move only if this answer reaches it in
        time, so a give-up that lands after this check is still safe:
        the source's abort (or, if it cannot reach this node, the monitor
        seeing ``aborted``) removes the clone.
        """
        current = self.load_any(volume['id'])
        if t.same_transfer(current) and current.state == transfer.PREPARING:
            return
        LOG.warning('The source of volume %(vol)s gave up the move while '
                    'this node built its clone (state now %(state)s); '
                    'removing the clone.',
                    {'vol': volume['id'],
                     'state': current.state if current else 'none'})
        if current is not None and current.state == transfer.ABORTED \
                and self.is_dest(current):
            self._drop_aborted(volume, current)
        else:
            self.destination().tear_down(t, volume['provider_auth'])
        raise exception.VolumeBackendAPIException(
            data=_('The move of volume %s was given up by its source '
                   'while the clone was built here; nothing was kept.')
            % volume['id'])

    def detached(self, volume, connector):
        """A connection of a volume in transfer here goes away.

        Detach on the source (live migration done): commit, hydrate.
        Detach here while the source still holds it (live migration
        failed): roll back; the volume stays on the source -- unless the
        clone already took writes here (see :meth:`_hold`).
        Returns True if the transfer handled it.
        """
        host = (connector or {}).get('host')
        t = self.load(volume['id'])
        if self._half_rolled_back(volume, t):
            # (Then the detach goes on as any here: the export goes.)
            self._finish_rollback(volume)
            return False
        if not self.is_dest(t) or host is None:
            return False
        if t.state != transfer.CLONED:
            # The source's detach again, after the commit was recorded (a
            # retry after this service died before answering): its
            # connection ended with the commit, nothing is exported here.
            return host in t.source_names
        with lock(volume['id']):
            # Read again under the lock: the move may have been committed
            # or rolled back by a detach that held it first.
            t = self.load(volume['id'])
            if not self.is_dest(t) or t.state != transfer.CLONED:
                return self.is_dest(t) and host in t.source_names
            current = self.attachments(volume)
            on_source = attachments_on(volume, t.source_names, current)
            if host in t.source_names:
                if on_source <= 1:
                    self.commit(volume, t)
                return True
            if host in self.node_names and on_source > 0:
                self._roll_back_unless_written(volume, t)
                return True
        return False

    def _hold(self, volume, t):
        """Keep a clone that took writes although the source is attached.

        The instance ran here (a live migration switched over), so the
        clone holds its latest writes; the source's attachment outlived
        the migration (its compute died before cleaning up, or its detach
        failed).  Rolling back would discard every write since the switch,
        and committing would hydrate under a source that may still write.
        Neither is safe without an operator: the move waits in ``cloned``
        and is reported until the stale attachment is removed, which
        commits it.
        """
        self.held.add(volume['id'])
        self.store.mark_stale_source_attachment(self.ctxt(), t)
        LOG.error('Volume %(vol)s was detached on %(dst)s, where it took '
                  'writes, while node %(src)s still has an attachment: the '
                  'move is kept (not rolled back) so that no write is '
                  'lost, with hydration off. If no instance on %(src)s '
                  'uses the volume any more, delete that attachment '
                  '(openstack volume attachment delete): the move then '
                  'commits and hydrates.',
                  {'vol': volume['id'], 'dst': t.dest_node,
                   'src': t.source_node})

    def _half_rolled_back(self, volume, t):
        """True for a move in ``cloned`` whose record names us again.

        The destination points the record back at the source in the
        middle of its rollback; a crash there leaves the state behind on
        a volume that no longer moves, and the destination's recovery no
        longer sees it (nothing of it is left there).  The source sees it
        at the next detach (Nova retries the one that failed) or restart.
        """
        return (self.is_source(t) and t.state == transfer.CLONED
                and volume_utils.extract_host(volume['host'], 'host')
                in self.node_names)

    def _finish_rollback(self, volume):
        with lock(volume['id']):
            t = self.load(volume['id'])
            if self._half_rolled_back(volume, t):
                LOG.warning('Finishing the rollback of the move of volume '
                            '%(vol)s to %(dst)s that its destination did not '
                            'complete.', {'vol': volume['id'],
                                          'dst': t.dest_node})
                self._give_up(self.ctxt(), volume, t)

    def commit(self, volume, t):
        self.destination().enable_hydration(t)
        self.store.transition(self.ctxt(), t, (transfer.CLONED,),
                              transfer.HYDRATING)
        self.held.discard(volume['id'])
        LOG.info('Transfer of volume %(vol)s committed: hydrating from '
                 '%(src)s.', {'vol': volume['id'], 'src': t.source_node})

    def rollback(self, volume, t):
        ctxt = self.ctxt()
        LOG.warning('Rolling back the transfer of volume %(vol)s: it stays '
                    'on %(src)s.', {'vol': volume['id'],
                                    'src': t.source_node})
        self.destination().tear_down(t, volume['provider_auth'])
        self.store.move_volume(ctxt, volume['id'], t.source_host,
                               self.host_zone(ctxt, t.source_host))
        try:
            self._request(ctxt, volume, t, t.source_host, peer.RELEASE)
        except Exception:
            LOG.exception('Source %(src)s did not drop the export of '
                          '%(vol)s; it is harmless and goes with the next '
                          'detach there.', {'src': t.source_node,
                                            'vol': volume['id']})
        self.store.clear(ctxt, volume['id'], t)

    def refuse_extend_while_undecided(self, volume):
        """No extend while a live migration may still roll back.

        In ``cloned`` the move may still be rolled back to the source,
        whose LV has the old size: the volume record would then claim a
        size its LV does not have.  In ``preparing`` the destination
        builds a clone of the old size.  Once the move is committed the
        destination's LV is the volume, and an extend is mapped linearly
        past the clone.  The check waits for a move being set up.
        """
        with lock(volume['id']):
            t = self.load(volume['id'])
        if t is not None and t.state in (transfer.PREPARING,
                                         transfer.CLONED):
            raise transfer.TransferInProgress(
                volume_name=volume['name'], source=t.source_node,
                dest=t.dest_node, state=t.state, percent='0.0',
                action=_('an extend (the live migration is not decided '
                         'yet)'))

    def extend(self, volume):
        """Grow the table of a clone after its LV grew; False if none."""
        t = self.load(volume['id'])
        if not self.is_dest(t) or t.state == transfer.FINALIZING:
            return False
        with lock(volume['id']):
            return self.destination().extend(t)

    def retune(self, volume, volume_type):
        """Apply a new volume type's hydration tuning to a live clone."""
        t = self.load(volume['id'])
        if self.is_dest(t) and t.state in (transfer.CLONED,
                                           transfer.HYDRATING):
            threshold, batch = self.tuning(volume_type)
            self.destination().tune(t, threshold, batch)

    def delete(self, volume):
        """A volume in transfer here is deleted: clean both nodes.

        Returns False when the caller still has to delete the volume's LV
        here (no transfer into this node).
        """
        t = self.load_any(volume['id'])
        if t is None or not (self.is_dest(t) or t.state == transfer.ABORTED):
            return False
        ctxt = self.ctxt()
        with lock(volume['id']):
            t = self.load_any(volume['id'])
            if t is not None and t.state == transfer.ABORTED:
                if self.is_source(t):
                    self._give_up(ctxt, volume, t)
                return False
            if not self.is_dest(t):
                return False
            self.destination().tear_down(t, volume['provider_auth'])
            self._request(ctxt, volume, t, t.source_host, peer.RETIRE)
            self.store.clear(ctxt, volume['id'], t)
            self.pending_finalize.discard(volume['id'])
            self.held.discard(volume['id'])
        return True

    # -- destination: monitor and finalization ----------------------------

    def on_status(self, lv_name, status, progress):
        """Hydration monitor callback for one clone handle."""
        volume_id = (self.lv_volumes.get(lv_name)
                     or volume_utils.extract_id_from_volume_name(lv_name))
        try:
            t = self.load_any(volume_id) if volume_id else None
        except exception.VolumeNotFound:
            t = None
        if t is not None and t.lv_name != lv_name:
            t = None
        if self.is_dest(t) and t.state == transfer.ABORTED:
            # The source gave up while this node was still building (its
            # answer came too late): nothing will ever use this clone.
            with lock(volume_id):
                # Only if it is still that move: a retried one may have
                # taken the lock first and be building right now.
                current = self.load_any(volume_id)
                if t.same_transfer(current) and \
                        current.state == transfer.ABORTED:
                    self._drop_aborted(
                        objects.Volume.get_by_id(self.ctxt(), volume_id),
                        current)
            return
        if not self.is_dest(t):
            self._report_orphan(lv_name, volume_id)
            return
        self.orphans.discard(lv_name)
        if status.failed:
            LOG.error('Clone of volume %(vol)s reports %(st)s: check the '
                      'metadata LV and the path to %(src)s.',
                      {'vol': volume_id, 'st': status.state,
                       'src': t.source_node})
            return
        self.store.publish_progress(self.ctxt(), volume_id, progress)
        self.progress[volume_id] = (t, progress)
        self._report_stall(volume_id, t, progress)
        LOG.info('Volume %(vol)s: %(pct).1f%% hydrated from %(src)s%(eta)s.',
                 {'vol': volume_id, 'pct': progress.percent,
                  'src': t.source_node,
                  'eta': '' if progress.eta is None
                  else ', %d s to go' % progress.eta})
        if t.state == transfer.HYDRATING and status.fully_hydrated:
            self.finalize(volume_id)

    def _report_orphan(self, lv_name, volume_id):
        """Say once that a clone here is described by no transfer.

        It is left from a move that was abandoned (the volume was then
        deleted, or moved elsewhere).  It is never removed automatically:
        an instance may still hold it open.
        """
        if lv_name in self.orphans:
            return
        self.orphans.add(lv_name)
        LOG.warning('Clone target of LV %(lv)s belongs to no transfer into '
                    'this node that this service knows of (volume %(vol)s '
                    'by its name). Before anything else, look the LV up in '
                    'the database: a volume whose _name_id or '
                    'dmclone_lv_name names it is still moving (restart '
                    'this service so that it finds it). Only if none does '
                    'is it left from an abandoned move: then check that '
                    'nothing has it open (dmsetup info), remove it, log '
                    'out of its iSCSI session and delete its LV and '
                    'metadata LV.', {'lv': lv_name,
                                     'vol': volume_id or 'unknown'})

    def _report_stall(self, volume_id, t, progress):
        """Say once that hydration stopped, and once that it came back.

        A path to the source that stays down longer than open-iscsi's
        replacement timeout fails the instance's reads of regions not yet
        copied, and the kernel just keeps retrying the copy: without this
        the operator would see I/O errors in a guest and a frozen
        percentage, and nothing naming the cause.
        """
        if not self.stall_timeout:
            return
        if progress.stalled_seconds >= self.stall_timeout:
            if volume_id not in self.stalled:
                self.stalled.add(volume_id)
                LOG.error('Hydration of volume %(vol)s from %(src)s has '
                          'made no progress for %(s)d s at %(pct).1f%%: '
                          'this node cannot read the source. Reads of '
                          'regions not copied yet wait or fail until it '
                          'can; the source LV on %(src)s still holds the '
                          'data. Check the network path to %(portal)s and '
                          'the iSCSI session to %(iqn)s (iscsiadm -m '
                          'session -P 3); hydration resumes by itself when '
                          'the path is back.',
                          {'vol': volume_id, 'src': t.source_node,
                           's': progress.stalled_seconds,
                           'pct': progress.percent,
                           'portal': t.target_portal, 'iqn': t.target_iqn})
        elif volume_id in self.stalled:
            self.stalled.discard(volume_id)
            LOG.info('Hydration of volume %(vol)s from %(src)s advances '
                     'again (%(pct).1f%%).',
                     {'vol': volume_id, 'src': t.source_node,
                      'pct': progress.percent})

    def progress_report(self):
        """Transfers into this node as the pool stats publish them.

        The scheduler's pool listing (``cinder get-pools --detail``) is
        where an admin sees them through the API: the volume's admin
        metadata, which holds the same figures, is not shown by Cinder's
        volume API.  Transfers that ended since the last tick are dropped.
        """
        report = {}
        for volume_id, (t, progress) in sorted(self.progress.items()):
            try:
                current = self.load(volume_id)
            except exception.VolumeNotFound:
                current = None      # deleted since the last tick
            if not self.is_dest(current):
                self.progress.pop(volume_id, None)
                # A stall reported for a move that ended (rolled back,
                # deleted) must not silence the report of a later one.
                self.stalled.discard(volume_id)
                continue
            entry = dict(progress.as_dict(), state=current.state,
                         source=t.source_node,
                         stalled=volume_id in self.stalled,
                         stale_source_attachment=volume_id in self.held)
            report[volume_id] = entry
        return report

    def finalize_pending(self):
        for volume_id in sorted(self.pending_finalize):
            self.finalize(volume_id)

    def finalize(self, volume_id):
        """Swap to linear, drop metadata and session, retire the source.

        Each step is idempotent; a failure keeps the transfer in
        ``finalizing`` and the next monitor tick tries again.
        """
        ctxt = self.ctxt()
        try:
            with lock(volume_id):
                t = self.load(volume_id)
                if not self.is_dest(t):
                    self.pending_finalize.discard(volume_id)
                    return
                volume = objects.Volume.get_by_id(ctxt, volume_id)
                if t.state != transfer.FINALIZING:
                    self.store.transition(ctxt, t, (transfer.HYDRATING,),
                                          transfer.FINALIZING)
                dest = self.destination()
                dest.swap_to_linear(t)
                dest.remove_metadata(t)
                dest.disconnect_source(t, volume.provider_auth)
                self._request(ctxt, volume, t, t.source_host, peer.RETIRE)
                # The source's export goes from the record before the
                # state does, so a crash in between is finalized again.
                self.store.db.volume_update(
                    ctxt, volume_id,
                    {'provider_location': None, 'provider_auth': None})
                self.store.clear(ctxt, volume_id, t)
                self.pending_finalize.discard(volume_id)
                LOG.info('Transfer of volume %(vol)s finished: it lives on '
                         '%(node)s alone.', {'vol': volume_id,
                                             'node': t.dest_node})
        except Exception:
            self.pending_finalize.add(volume_id)
            LOG.exception('Finalizing the transfer of volume %s failed; '
                          'retrying at the next monitor tick.', volume_id)

    # -- recovery at service start -----------------------------------------

    def recover(self, volumes, metadata_lvs):
        """Resume, finish or roll back every transfer touching this node.

        ``volumes`` are the volumes whose record names this node or whose
        transfer does; ``metadata_lvs`` the metadata LV names present here.
        Leftovers that match no transfer are reported, never deleted.
        """
        known = set()
        for volume in volumes:
            try:
                t = transfer.Transfer.from_metadata(
                    volume.id, volume.admin_metadata)
            except transfer.TransferStateInvalid:
                LOG.exception('Not recovering volume %s.', volume.id)
                continue
            if t is None:
                continue
            known.add(t.lv_name)
            if self.is_dest(t):
                self.lv_volumes[t.lv_name] = volume.id
            try:
                self._recover_one(volume, t)
            except Exception:
                LOG.exception('Recovering the transfer of volume %s failed.',
                              volume.id)
        for name in metadata_lvs:
            lv = layout.lv_name_from_metadata_lv(name)
            if lv and lv not in known:
                LOG.warning('Metadata LV %s matches no transfer into this '
                            'node; left in place for an operator to check.',
                            name)

    def _recover_one(self, volume, t):
        ctxt = self.ctxt()
        here = volume_utils.extract_host(volume.host, 'host')
        if self.is_source(t) and here in self.node_names:
            # The source crashed before the move was committed, or gave
            # it up while the destination was unreachable.
            LOG.warning('Transfer of volume %s never completed; asking '
                        '%s to drop its side.', volume.id, t.dest_node)
            self._drop_export(volume, {'initiator': None, 'host': None})
            self._give_up(ctxt, volume, t)
            return
        if not self.is_dest(t):
            return
        if t.state == transfer.ABORTED:
            self._drop_aborted(volume, t)
            return
        dest = self.destination()
        commit = False
        if t.state == transfer.CLONED:
            rollback, commit = self._lost_detach(volume, t)
            if rollback or not dest.has_data(t):
                # (No data LV: a rollback's teardown had begun.)
                self._roll_back_unless_written(volume, t)
                return
        if t.state == transfer.PREPARING:
            # The source holds the lock while it waits for this node and
            # owns the state: it aborts (or, if it died, its recovery
            # does), and then clears it.
            LOG.warning('Transfer of volume %s was half built; rolling '
                        'back this node.', volume.id)
            dest.tear_down(t, volume.provider_auth)
            return
        if t.state == transfer.FINALIZING and not dest.needs_rebuild(t):
            self.pending_finalize.add(volume.id)
            return
        if not dest.has_data(t):
            # Only a delete removes the LV of a committed move: it was cut
            # short, and the volume is in error_deleting.
            LOG.warning('Volume %s has no LV here any more: its delete was '
                        'interrupted; delete it again.', volume.id)
            return
        # (FINALIZING after a reboot: rebuild the clone so that the swap
        # can check it is fully hydrated.)
        threshold, batch = self.tuning(volume.volume_type)
        source = dest.connect_source(t, volume.provider_auth)
        dest.build_clone(t, source, commit or t.state != transfer.CLONED,
                         threshold, batch)
        if commit:
            self.commit(volume, t)
        if t.state == transfer.FINALIZING:
            self.pending_finalize.add(volume.id)
        LOG.info('Clone of volume %(vol)s rebuilt after restart '
                 '(%(state)s).', {'vol': volume.id, 'state': t.state})

    def _roll_back_unless_written(self, volume, t):
        """Roll a move in ``cloned`` back, unless the clone took writes.

        The clone is rebuilt first (hydration off) when a reboot, or a
        crash in an earlier rollback's teardown, took it: only the clone
        tells whether the instance already wrote here, and a clone that
        took writes is never rolled back (see _hold).  A missing data LV
        means a rollback's teardown already began: nothing is left to
        keep, and the rollback is finished.
        """
        dest = self.destination()
        if dest.has_data(t):
            if dest.needs_rebuild(t):
                dest.build_clone(t, dest.connect_source(
                    t, volume.provider_auth), False,
                    *self.tuning(volume.volume_type))
            if dest.written(t):
                self._hold(volume, t)
                return
        self.rollback(volume, t)

    def _lost_detach(self, volume, t):
        """(rollback, commit): the detach a crash in ``cloned`` lost.

        In ``cloned`` the live migration's outcome is decided by detaches.
        One may have been lost with the crash (the service died between
        enabling hydration and recording the commit, or half way through
        a rollback).  The attachments say what happened: none left on the
        source means the instance runs here (commit); none here while the
        source still has one means the migration failed (roll back).
        """
        current = self.attachments(volume)
        on_source = attachments_on(volume, t.source_names, current)
        on_dest = attachments_on(volume, self.node_names, current)
        return bool(on_source and not on_dest), not on_source
