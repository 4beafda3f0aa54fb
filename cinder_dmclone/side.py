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

"""What both sides of a move share: who this node is, and its tools.

A node is the source of the volumes that move away from it and the
destination of those that move to it; :class:`Side` is the part of each
that does not depend on which: the node's names, the move store, the
client that sends steps to the other node, and the reads every step
starts with.
"""

from oslo_config import cfg
from oslo_log import log as logging

from cinder import context
from cinder import exception
from cinder.i18n import _
from cinder import objects
from cinder.objects import fields
from cinder.volume import volume_utils

from cinder_dmclone import evidence
from cinder_dmclone import exception as dmc_exception
from cinder_dmclone import layout
from cinder_dmclone import move
from cinder_dmclone import peer

LOG = logging.getLogger(__name__)


def describe_record(t):
    """A move record, for a log line an operator reads (None: none)."""
    if t is None:
        return 'none'
    return ('%s, from %s to %s, recorded at %s'
            % (t.state, t.source_node, t.dest_node, t.prepared_at))


class Side(object):
    """One side of the moves of this node.

    ``node_names`` are every name the node's connectors and services use
    (its name and its ``dmclone_node_aliases``), ``node_name`` the one it
    gives others; ``store`` is the :class:`cinder_dmclone.move.Store`,
    ``peer`` the :class:`cinder_dmclone.peer.PeerClient`;
    ``service_host`` the host part of this node's volume service's
    ``host``, which the volume records of this node name; ``evidence``
    this node's marks of the moves it takes part in
    (:class:`~cinder_dmclone.evidence.Evidence`; None: none are kept,
    and every record is taken as it reads).
    """

    def __init__(self, node_names, node_name, store, peer,
                 service_host=None, evidence=None):
        self.node_names = frozenset(node_names)
        #: the names a volume record of this node may carry: the node's
        #: names and its volume service's host, which differ when
        #: dmclone_node_name is set to the compute service's name.
        self.record_names = self.node_names | (
            {service_host} if service_host else set())
        self.node_name = node_name
        self.store = store
        self.peer = peer
        #: volumes whose undated ``preparing`` was reported.
        self.undated = set()
        self.evidence = evidence
        #: volume id -> (record's secret, mark's secret) last reported as
        #: contradicting each other (see report_contradiction).
        self.contradictions = {}

    @staticmethod
    def ctxt():
        return context.get_admin_context()

    def is_dest(self, t):
        return t is not None and t.dest_node in self.node_names

    def is_source(self, t):
        return t is not None and t.source_node in self.node_names

    @staticmethod
    def names_destination(volume, t):
        """True if the volume record's host is move ``t``'s destination.

        The source writes it (``t.dest_host``) only once it committed the
        move (Source.move: the state, then the host), and only the
        destination's rollback writes another host while the move is
        recorded: so a move recorded ``preparing`` whose volume names its
        destination was committed, and set back since by a whole save of
        an older copy of the admin metadata (R14-4, see
        Destination.roll_forward).  The host is Cinder's column, which no
        volume owner writes; the backends are compared (``host@backend``),
        as the pool part is the scheduler's.
        """
        host = volume['host'] if volume is not None else None
        if t is None or not host:
            return False
        return volume_utils.extract_host(host, 'backend') == \
            volume_utils.extract_host(t.dest_host, 'backend')

    @staticmethod
    def names_source_export(volume, t):
        """True if ``provider_location`` is move ``t``'s source export.

        Its primary portal and its IQN (also with secondary portals:
        :func:`~cinder_dmclone.layout.export_portal`, as the driver
        reads it).  Cinder's column, which no save of the admin metadata
        writes: a move's finalization forgets it once the source retired
        (Store.forget_source_export).
        """
        location = volume['provider_location']
        return (bool(t.target_portal)
                and layout.export_portal(location) == t.target_portal
                and layout.export_iqn(location) == t.target_iqn)

    # -- this node's own evidence --------------------------------------

    def contradiction(self, volume_id, t):
        """This node's mark that contradicts record ``t``, or None.

        (:meth:`Evidence.contradiction
        <cinder_dmclone.evidence.Evidence.contradiction>`: a mark of
        another move, whose data is still here.)
        """
        if self.evidence is None:
            return None
        return self.evidence.contradiction(volume_id, t)

    def marked_move(self, volume_id, role, secret):
        """The move this node's mark names as its ``role``, by ``secret``.

        None unless this node holds a usable mark of the volume as
        ``role`` of a move whose secret is ``secret``: a step for a move
        whose record a stale whole save replaced is authenticated by the
        mark instead (:meth:`authenticate`), which only this node and
        the move's two services ever held.
        """
        if self.evidence is None:
            return None
        part = self.evidence.read(volume_id)
        if part is None or part.role != role or \
                not part.move.authentic(secret):
            return None
        return part.move

    def end_every_part(self, volume_id):
        """The volume is deleted: this node's mark of it goes, whatever move.

        (Evidence.drop.)  No move of a deleted volume is to survive, and
        the mark holds a move's secret.
        """
        if self.evidence is not None:
            self.evidence.drop(volume_id)

    def marked_volume_ids(self):
        """The ids of the volumes this node marked a part in (none: none)."""
        if self.evidence is None:
            return []
        return self.evidence.volume_ids()

    def refuse_if_contradicted(self, volume_id, t, step):
        """MoveContradicted if this node's mark contradicts record ``t``.

        Before a step that removes or gives up anything, or maps a copy
        alone, on the word of record ``t`` (``step`` names it): a record
        naming another move than the one this node takes part in was set
        back by a stale whole save of the admin metadata, and the data
        here may be the only whole copy, or a partial one.  Nothing is
        done; said once per pair of moves (:meth:`report_contradiction`).
        """
        part = self.contradiction(volume_id, t)
        if part is None:
            return
        self.report_contradiction(volume_id, t, part, step)
        raise dmc_exception.MoveContradicted(
            volume=volume_id, step=step, record=describe_record(t),
            part=part.describe())

    def report_contradiction(self, volume_id, t, part, step):
        """Say, once per pair of moves, that record ``t`` is not acted on."""
        pair = (t.secret if t is not None else None, part.move.secret)
        if self.contradictions.get(volume_id) == pair:
            return
        self.contradictions[volume_id] = pair
        LOG.warning('Volume %(vol)s: its move record (%(record)s) '
                    'contradicts this node\'s own mark: it is the '
                    '%(part)s, whose data is still here (a stale copy of '
                    'the admin metadata saved whole?). Not taken on the '
                    'record\'s word: %(step)s. Nothing is removed on this '
                    'node; the destination of the move in progress '
                    'restores its record if it can, else check both nodes '
                    'with "cinder-dmclone status".',
                    {'vol': volume_id, 'record': describe_record(t),
                     'part': part.describe(), 'step': step})

    def load(self, volume_id):
        """The volume's move in progress, or None.

        An ``aborted`` move is not in progress: the volume is back to
        normal on its source, only leftovers on the destination remain
        (see :meth:`load_any`).
        """
        t = self.load_any(volume_id)
        return None if t is None or t.state == move.ABORTED else t

    def load_any(self, volume_id):
        """The volume's move record, aborted ones included."""
        return self.store.load(self.ctxt(), volume_id)

    def stale_prepare_after(self):
        """Seconds an attempt to move a volume away from here may last.

        The source waits for the destination's prepare at most the
        transfer timeout (without one, the RPC timeout), then records the
        outcome; the margin covers its database writes.  Recorded with
        the move (its deadline, see :meth:`Store.save
        <cinder_dmclone.move.Store.save>`): the other node judges the
        move by the source's figure, never by its own.
        """
        timeout = self.peer.timeout or cfg.CONF.rpc_response_timeout
        return timeout + move.STALE_PREPARE_MARGIN

    def prepare_budget(self, t):
        """Seconds the attempt that recorded move ``t`` may last.

        As its source recorded it; a move recorded before the deadline
        was recorded is given this node's own figure.
        """
        budget = t.prepare_budget
        return self.stale_prepare_after() if budget is None else budget

    def prepare_age(self, t):
        """Seconds this node vouches have passed since ``t``'s attempt began.

        None if nothing tells (a move recorded by an older release).
        Each side measures on a clock it can trust (see the subclasses):
        no node ever compares its clock with another's.
        """
        raise NotImplementedError()

    def prepare_outlived(self, t):
        """True if move ``t``, ``preparing``, is older than any attempt.

        The only proof that no attempt will still record the outcome of
        a prepare: a free volume lock is none (per-node locks, a lost
        lease of the coordination backend).  Older means: more of this
        node's :meth:`prepare_age` than the source's recorded
        :meth:`prepare_budget`.  A move recorded by an older release
        has no start time: never taken for dead, reported once.
        """
        age = self.prepare_age(t)
        if age is not None:
            return age > self.prepare_budget(t)
        if t.volume_id not in self.undated:
            self.undated.add(t.volume_id)
            LOG.warning('The move of volume %(vol)s from %(src)s to %(dst)s '
                        'is preparing and has no start time (recorded by '
                        'an older release): it is never ended as dead. If '
                        'no attach of the volume is in progress, restart '
                        'the volume service of %(src)s: its recovery ends '
                        'the move.', {'vol': t.volume_id,
                                      'src': t.source_node,
                                      'dst': t.dest_node})
        return False

    def refuse_if_moving(self, volume, action, locked=False):
        """Raise MoveInProgress if the volume is being moved.

        With ``locked``, a move being set up right now (the source holds
        the lock while the destination builds) is waited for and seen.
        """
        t = self.load(volume['id'])
        if t is not None and locked:
            with move.lock(volume['id']):
                t = self.load(volume['id'])
        if t is not None:
            self.raise_moving(volume, t, action)

    def refuse_local_attach(self, volume, action):
        """Refuse an attach on this node while a move makes it unsafe.

        A move being set up is waited for (the source holds the volume's
        lock while the destination builds).  On the move's source the
        local LV is no longer the volume, or is about to stop being it.
        On its destination, once the clone is built, the handle *is* the
        volume: an attach there is as safe as the one that moved it (a
        re-attach during hydration, the first attach after a migration).

        With no move recorded, nothing is waited for: Cinder reserved this
        attach's attachment before it asked for the connection, and a
        move reads the attachments only after it recorded itself (see
        Source._may_be_used_here).  Of this read and a move's record,
        whichever comes second sees the other: the move is refused here,
        or the move counts this attachment and does not hydrate from the
        copy here until it is detached.
        """
        t = self.load(volume['id'])
        if t is None:
            return
        with move.lock(volume['id']):
            t = self.load(volume['id'])
            if t is None:
                # The move ended while this waited for the lock (a
                # rollback, with a destination's kept LV): the caller's
                # volume object predates it.
                self.refuse_unless_here(volume, action)
        if t is not None and not (self.is_dest(t)
                                  and t.state != move.PREPARING):
            self.raise_moving(volume, t, action)

    def refuse_unless_here(self, volume, action):
        """Refuse if the volume record, read now, does not name this node.

        An LV here named like a volume that lives elsewhere is no copy to
        serve: an old copy kept by a rollback (see
        Destination.roll_back_without_metadata) or an abandon as lost.
        """
        current = objects.Volume.get_by_id(self.ctxt(), volume['id'])
        if volume_utils.extract_host(current.host, 'host') \
                not in self.record_names:
            LOG.error('Refusing %(action)s for volume %(vol)s on this node: '
                      'its record names %(host)s now; an LV here named '
                      'like it is no copy to serve.',
                      {'action': action, 'vol': volume['id'],
                       'host': current.host})
            raise exception.VolumeBackendAPIException(
                data=_('Volume %(vol)s lives on %(host)s, not on this '
                       'node: refusing %(action)s.')
                % {'vol': volume['id'], 'host': current.host,
                   'action': action})

    def refuse_delete_unless_here(self, volume):
        """Refuse a delete if the volume record, read now, names another node.

        Cinder routes a delete by cinder-api's read of the record, which
        may predate a rollback that kept this node's LV (named like the
        volume, see Destination.roll_back_without_metadata).  That LV is
        no longer the volume and may hold an instance's last writes: it
        is an operator's, and the volume's delete belongs to the node its
        record names.  Refused, nothing here is removed, and Cinder keeps
        the record (``error_deleting``): a new delete goes to that node.
        A record still ``creating`` is let through: Cinder's create flow,
        rescheduling a create that failed here, clears the record's host
        before it deletes what the driver made here.
        """
        current = objects.Volume.get_by_id(self.ctxt(), volume['id'])
        if current.status == fields.VolumeStatus.CREATING or \
                volume_utils.extract_host(current.host, 'host') \
                in self.record_names:
            return
        LOG.error('Refusing to delete volume %(vol)s on this node: its '
                  'record names %(host)s now (this delete was routed by an '
                  'older read). Nothing is removed here; an LV here named '
                  'like the volume is not the volume (a copy kept by a '
                  'rollback?) and is left for an operator. Delete the '
                  'volume again: Cinder sends it to %(host)s.',
                  {'vol': volume['id'], 'host': current.host})
        raise exception.VolumeBackendAPIException(
            data=_('Volume %(vol)s lives on %(host)s, not on this node: '
                   'refusing a delete routed here by an older read of its '
                   'record; delete it again.')
            % {'vol': volume['id'], 'host': current.host})

    def raise_moving(self, volume, t, action, percent=None):
        if percent is None:
            percent = self.store.percent(self.ctxt(), volume['id'])
        raise move.MoveInProgress(
            volume_name=volume['name'], source=t.source_node,
            dest=t.dest_node, state=t.state, percent=percent, action=action)

    def send(self, ctxt, volume, t, host, op, deleting=False):
        """Send step ``op`` of move ``t`` to ``host``'s service.

        The caller holds the volume's lock: a move recorded by release
        1.1.0 gets its secret here, before the other node needs it.
        ``deleting``: a retire sent by a delete (peer.DELETING).
        """
        self.store.ensure_secret(ctxt, t)
        self.peer.request(ctxt, volume, host, op, t.secret,
                          deleting=deleting)

    def authenticate(self, volume, step, ops=peer.OPS):
        """The move a node-to-node step belongs to, or StepRefused.

        A step must carry the secret of the move it acts on, come by the
        call that carries its kind (``ops``), and its operation must fit
        this node's side of the move.  Anything else came through the
        public API (an owner's connector with a ``dmclone`` entry) and
        changes nothing.

        One exception: an abort whose secret is not the record's is
        authenticated by this node's own mark as the destination of the
        move it names (:meth:`marked_move`).  A stale whole save of the
        admin metadata replaced the record of that move, which its
        source then gave up (it could no longer commit it): without its
        abort the clone built here, never handed to an instance, would
        stay with nothing to remove it.  The move returned is then the
        mark's, for the destination to check (Destination.abort).
        """
        op = step.get('op')
        t = self.load_any(volume['id'])
        reason = None
        if t is None:
            reason = 'no transfer of this volume is recorded'
        elif not t.authentic(step.get('secret')):
            reason = 'it does not carry the transfer\'s secret'
        elif op not in ops:
            reason = 'this call does not carry %s steps' % op
        elif op in (peer.PREPARE, peer.ABORT, peer.DETACHED) and \
                not self.is_dest(t):
            reason = 'this node is not the destination'
        elif op in (peer.RELEASE, peer.RETIRE, peer.CLOSED) and \
                not self.is_source(t):
            reason = 'this node is not the source'
        if reason and op == peer.ABORT and op in ops and \
                (t is None or not t.authentic(step.get('secret'))):
            marked = self.marked_move(volume['id'], evidence.DESTINATION,
                                      step.get('secret'))
            if marked is not None:
                return marked
        if reason:
            LOG.warning('Refused dmclone step %(op)s for volume %(vol)s: '
                        '%(why)s (a request through the public API?).',
                        {'op': op, 'vol': volume['id'], 'why': reason})
            raise dmc_exception.StepRefused(op=op, volume=volume['id'],
                                            reason=reason)
        return t
