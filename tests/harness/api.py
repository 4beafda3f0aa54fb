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

"""The testbed's Cinder API as its users meet it.

:class:`Cloud` talks to cinder-api through python-cinderclient (one process:
each ``openstack`` CLI call costs 20-60 s under emulation, so the CLI is
used where the CLI itself is under test).  :meth:`Cloud.attach` and
:meth:`Cloud.detach` do what Nova's compute manager does: reserve an
attachment for an instance, update it with the os-brick connector of the
compute node, connect with os-brick, complete; and the reverse.
"""

import json
import logging
import subprocess
import time
import uuid

from tests.harness import services
from tests.harness import testbed
from tests.harness import workers

LOG = logging.getLogger('cloud')


def load_brick():
    """Import os-brick's connectors; call it from the main thread first.

    os-brick imports eventlet (through oslo.privsep).  Imported first in a
    worker thread of a ``ThreadPoolExecutor``, it leaves the pool's
    shutdown waiting forever once the map is done: the load test's first
    runs hung right after twenty attaches (reproduced outside the guest).
    """
    from os_brick.initiator import connector  # noqa: F401


# ---- a compute node's side: run in the node's own process ----------------

_BRICK = {}


def _brick():
    """os-brick in this process, as root (privileged calls in-process)."""
    if not _BRICK:
        load_brick()
        from os_brick import privileged
        from oslo_concurrency import lockutils
        lockutils.set_defaults('/var/lib/cinder/tmp')
        privileged.default.set_client_mode(False)
        _BRICK['ready'] = True


def brick_connector_properties(ip, host):
    """This compute node's os-brick connector properties."""
    _brick()
    from os_brick.initiator import connector
    return connector.get_connector_properties(None, ip, False, False,
                                              host=host)


def _brick_connector(protocol):
    _brick()
    from os_brick.initiator import connector  # loaded by load_brick
    return connector.InitiatorConnector.factory(protocol, None,
                                                use_multipath=False)


def brick_connect(info):
    """os-brick connect_volume with the connection info Cinder gave."""
    return _brick_connector(info['driver_volume_type'].upper()
                            ).connect_volume(info)


def brick_disconnect(info, device):
    _brick_connector(info['driver_volume_type'].upper()
                     ).disconnect_volume(info, device)


def block_digests(path, length, block):
    """sha256 of every ``block`` bytes of the device's first ``length``."""
    return [testbed.sha256(chunk)
            for chunk in testbed.iter_direct(path, 0, length, chunk=block)]


TRANSFER_KEYS_QUERY = (
    "SELECT `key`, value FROM volume_admin_metadata WHERE deleted=0 AND "
    "volume_id='%s' AND `key` LIKE 'dmclone%%'")


def field(obj, name):
    """A field of a cinderclient answer: a dict or a Resource."""
    return obj[name] if isinstance(obj, dict) else getattr(obj, name)


class Attachment(object):
    def __init__(self, id, volume_id, node, connection_info, device,
                 instance):
        self.id = id
        self.volume_id = volume_id
        self.node = node
        self.connection_info = connection_info
        self.device = device
        self.instance = instance

    @property
    def path(self):
        return self.device['path']


#: where the default types place volumes: the nodes that are always up
HOME_AZS = ','.join(services.NODE_AZ[k] for k in ('a', 'b'))


class Cloud(object):
    """cinderclient with noauth, plus Nova's side of an attachment."""

    def __init__(self, stack, worker_log=None):
        """``worker_log``: where the workers on other nodes write stderr.

        (The demo's console shows its narrative only; the tests keep the
        workers' output with their own.)
        """
        from cinderclient import client
        from cinderclient.contrib import noauth
        from keystoneauth1 import session

        class NoAuth(noauth.CinderNoAuthPlugin):
            # cinder routes /v3/<resource> and takes the project from the
            # "user:project" token; the stock plugin appends a project id.
            def get_endpoint(self, session, **kwargs):
                return self._endpoint

            def get_headers(self, session, **kwargs):
                # Requests come from Nova's side: with a service role, as
                # Nova's service token gives them (Cinder then lets an
                # instance's attachment be deleted without asking Nova).
                headers = super(NoAuth, self).get_headers(session, **kwargs)
                headers['X-Service-Roles'] = 'service'
                return headers

        self.stack = stack
        self.topo = stack.topo
        sess = session.Session(auth=NoAuth('admin', 'admin',
                                           endpoint=services.API))
        self.c = client.Client(services.MICROVERSION, session=sess)
        self._nodes = workers.NodeCalls(stderr_path=worker_log)

    def on_node(self, node_key, fn, *args):
        """Run ``fn(*args)`` on compute node ``node_key``.

        Here, unless the node is another kernel (separate layout): then in
        a worker process on it, kept until :meth:`close`.
        """
        return self._nodes.call(node_key, fn, *args)

    def forget_node(self, node_key):
        """Drop the worker on a node that was powered off."""
        self._nodes.forget(node_key)

    def forget_silent_nodes(self):
        """Drop the workers on nodes rebooted since (by another harness)."""
        self._nodes.forget_silent()

    def close(self):
        self._nodes.close()

    # -- volumes -------------------------------------------------------------

    def ensure_volume_type(self):
        """The default type: this backend, placed on either node's AZ."""
        types = [t for t in self.c.volume_types.list()
                 if t.name == services.VOLUME_TYPE]
        vt = types[0] if types else self.c.volume_types.create(
            services.VOLUME_TYPE)
        vt.set_keys({'volume_backend_name': 'dmclone',
                     'RESKEY:availability_zones': HOME_AZS})
        return vt

    def ensure_multiattach_type(self):
        """A multiattach type of this backend, placed like the default."""
        name = services.VOLUME_TYPE + '-multiattach'
        types = [t for t in self.c.volume_types.list() if t.name == name]
        vt = types[0] if types else self.c.volume_types.create(name)
        vt.set_keys({'volume_backend_name': 'dmclone',
                     'multiattach': '<is> True',
                     'RESKEY:availability_zones': HOME_AZS})
        return vt

    def get(self, volume_id):
        return self.c.volumes.get(volume_id)

    @staticmethod
    def host_of(volume):
        return getattr(volume, 'os-vol-host-attr:host')

    def node_of(self, volume_id):
        host = self.host_of(self.get(volume_id)) or ''
        for key in sorted(self.topo.nodes):
            if host.startswith(self.topo.node(key).name + '@'):
                return key
        return None

    def wait_status(self, volume_id, want, timeout=600):
        seen = []

        def reached():
            v = self.get(volume_id)
            if not seen or seen[-1] != v.status:
                seen.append(v.status)
            if v.status.startswith('error') and not want.startswith('error'):
                raise AssertionError('volume %s went to %s (seen %s); '
                                     'user messages: %s' % (
                                         volume_id, v.status, seen,
                                         self.messages(volume_id)))
            return v.status == want
        testbed.wait_until(reached, timeout,
                           'volume %s %s' % (volume_id, want), interval=1,
                           diagnostics=lambda: 'statuses seen: %s' % seen)
        return self.get(volume_id)

    def create(self, size=1, az=None, name=None, volume_type=None,
               snapshot_id=None):
        t0 = time.monotonic()
        v = self.c.volumes.create(size, name=name or 'ft-%s' % uuid.uuid4(),
                                  availability_zone=az,
                                  volume_type=volume_type,
                                  snapshot_id=snapshot_id)
        v = self.wait_status(v.id, 'available')
        LOG.info('volume %s available on %s (%s) in %.1f s', v.id,
                 self.host_of(v), v.availability_zone,
                 time.monotonic() - t0)
        return v

    def retype(self, volume_id, type_name, timeout=600):
        """Retype within the backend (no migration); back to its status."""
        status = self.get(volume_id).status
        self.c.volumes.retype(volume_id, type_name, 'never')
        self.wait_status(volume_id, status, timeout=timeout)
        vt = self.get(volume_id).volume_type
        assert vt == type_name, 'volume %s has type %s after a retype to ' \
            '%s' % (volume_id, vt, type_name)

    def extend(self, volume_id, size, timeout=600):
        """Extend an available volume to ``size`` GiB; wait until done."""
        self.c.volumes.extend(volume_id, size)

        def grown():
            v = self.get(volume_id)
            if v.status.startswith('error'):
                raise AssertionError('volume %s went to %s extending to %d '
                                     'GiB; user messages: %s' % (
                                         volume_id, v.status, size,
                                         self.messages(volume_id)))
            return v.status == 'available' and v.size == size
        testbed.wait_until(grown, timeout, 'volume %s extended to %d GiB'
                           % (volume_id, size), interval=1)
        return self.get(volume_id)

    def create_snapshot(self, volume_id, timeout=600):
        """A snapshot of the volume, once available."""
        snap = self.c.volume_snapshots.create(
            volume_id, name='ft-snap-%s' % uuid.uuid4())
        seen = []

        def available():
            s = self.c.volume_snapshots.get(snap.id)
            if not seen or seen[-1] != s.status:
                seen.append(s.status)
            if s.status.startswith('error'):
                raise AssertionError('snapshot %s of %s went to %s' % (
                    snap.id, volume_id, s.status))
            return s.status == 'available'
        testbed.wait_until(available, timeout, 'snapshot %s available'
                           % snap.id, interval=1,
                           diagnostics=lambda: 'statuses seen: %s' % seen)
        return self.c.volume_snapshots.get(snap.id)

    def delete_snapshot(self, snapshot_id, timeout=600):
        self.c.volume_snapshots.delete(snapshot_id)

        def gone():
            try:
                s = self.c.volume_snapshots.get(snapshot_id)
            except Exception as exc:
                if getattr(exc, 'code', None) == 404:
                    return True
                raise
            if s.status == 'error_deleting':
                raise AssertionError('snapshot %s: error_deleting'
                                     % snapshot_id)
            return False
        testbed.wait_until(gone, timeout, 'snapshot %s deleted'
                           % snapshot_id, interval=1)

    def delete(self, volume_id, timeout=600):
        """Delete the volume, first dropping attachments a failure left."""
        for att in self.c.attachments.list(
                search_opts={'volume_id': volume_id}):
            LOG.warning('deleting leftover attachment %s of %s', att.id,
                        volume_id)
            self._forget(att.id)
        self.c.volumes.delete(volume_id)
        self.wait_gone(volume_id, timeout)

    def wait_gone(self, volume_id, timeout=600, what='deleted'):
        """Until the API knows the volume no more (deleted, unmanaged)."""
        seen = []

        def gone():
            try:
                v = self.get(volume_id)
            except Exception as exc:
                if getattr(exc, 'code', None) == 404:
                    return True
                raise
            if not seen or seen[-1] != v.status:
                seen.append(v.status)
            if v.status.startswith('error'):
                raise AssertionError('volume %s: %s (seen %s); user '
                                     'messages: %s' % (
                                         volume_id, v.status, seen,
                                         self.messages(volume_id)))
            return False
        testbed.wait_until(gone, timeout, 'volume %s %s' % (volume_id, what),
                           interval=1,
                           diagnostics=lambda: 'statuses seen: %s' % seen)

    def messages(self, volume_id):
        return [m.user_message for m in self.c.messages.list()
                if m.resource_uuid == volume_id]

    def transfer_state(self, volume_id):
        """The persisted transfer keys (admin metadata) of the volume."""
        out = self.stack._db(TRANSFER_KEYS_QUERY % volume_id)
        state = {}
        for line in out.splitlines():
            key, _sep, value = line.partition('\t')
            state[key] = value
        return state

    def name_id(self, volume_id):
        """The volume's ``_name_id``: None unless its LV has another name.

        (Not in the volume API: read from the database.)
        """
        out = self.stack._db("SELECT _name_id FROM volumes WHERE id='%s'"
                             % volume_id)
        return None if out in ('', 'NULL') else out

    # -- the operator's migration ---------------------------------------------

    def pool_name(self, node_key, backend=services.BACKEND):
        """The scheduler's name of a node's pool: ``host@backend#pool``.

        ``backend``: the pool of that backend of the node (the thin one
        runs beside it while :meth:`services.Stack.use_thin` is on).
        """
        prefix = '%s@%s#' % (self.topo.node(node_key).name, backend)
        names = [p['name'] for p in self.stack.pools()
                 if p['name'].startswith(prefix)]
        assert len(names) == 1, 'pools of node %s: %s (all: %s)' % (
            node_key, names, [p['name'] for p in self.stack.pools()])
        return names[0]

    def migration_status(self, volume_id):
        return getattr(self.get(volume_id), 'os-vol-mig-status-attr:migstat',
                       None)

    def migrate(self, volume_id, node_key, timeout=900,
                backend=services.BACKEND):
        """``cinder migrate`` to the node's pool; Cinder's outcome.

        (The pool of ``backend`` on the node: see :meth:`pool_name`.)

        The API records ``migration_status`` ``starting`` before it
        answers, so what is polled afterwards is this migration's: until
        it is ``success`` or ``error`` (returned).  A refusal of the API
        itself raises (cinderclient's error).
        """
        pool = self.pool_name(node_key, backend)
        t0 = time.monotonic()
        self.c.volumes.migrate_volume(volume_id, pool, False, False)
        seen = []

        def outcome():
            v = self.get(volume_id)
            now = (getattr(v, 'os-vol-mig-status-attr:migstat', None),
                   v.status, self.host_of(v))
            if not seen or seen[-1] != now:
                LOG.info('migration of %s to %s: migration_status %s, '
                         'status %s, host %s', volume_id, pool, *now)
                seen.append(now)
            if v.status.startswith('error'):
                raise AssertionError('volume %s went to %s while migrating '
                                     '(seen %s); user messages: %s' % (
                                         volume_id, v.status, seen,
                                         self.messages(volume_id)))
            return now[0] in ('success', 'error') and now[0]
        result = testbed.wait_until(
            outcome, timeout, 'migration of %s to %s decided'
            % (volume_id, pool), interval=2,
            diagnostics=lambda: 'seen (migration_status, status, host): %s;'
            ' transfer state %s; user messages %s' % (
                seen, self.transfer_state(volume_id),
                self.messages(volume_id)))
        LOG.info('migration of %s to %s: %s in %.1f s', volume_id, pool,
                 result, time.monotonic() - t0)
        return result

    # -- Nova's side ----------------------------------------------------------

    def connector(self, node_key):
        """The os-brick connector properties of a compute node."""
        node = self.topo.node(node_key)
        if node.initiator_iqn:
            props = self.on_node(node_key, brick_connector_properties,
                                 node.ip, node.name)
            props['initiator'] = node.initiator_iqn
            return props
        # Node A has no iSCSI initiator of its own in this one-kernel
        # testbed (the initiator's netlink lives in node B's namespace):
        # its connector names it, with an initiator name nothing uses.
        return {'host': node.name, 'ip': node.ip, 'multipath': False,
                'platform': 'x86_64', 'os_type': 'linux',
                'initiator': 'iqn.2024-01.org.example.nodea:initiator',
                'do_local_attach': False}

    def attach(self, volume_id, node_key, instance=None, mode='rw',
               migration=False):
        """Nova's attach: reserve, update with the connector, connect.

        ``migration``: the destination side of a live migration, where
        Nova creates the attachment with the connector in one request
        (Cinder refuses a second connector through an update of a volume
        that is not multiattach).
        """
        instance = instance or str(uuid.uuid4())
        t0 = time.monotonic()
        props = self.connector(node_key)
        if migration:
            att = self.c.attachments.create(volume_id, props,
                                            instance_id=instance, mode=mode)
            att_id = field(att, 'id')
            info = field(att, 'connection_info')
        else:
            att = self.c.attachments.create(volume_id, None,
                                            instance_id=instance, mode=mode)
            att_id = field(att, 'id')
            try:
                updated = self.c.attachments.update(att_id, props)
            except Exception:
                self._forget(att_id)
                raise
            info = field(updated, 'connection_info')
        device = self.connect(info, node_key)
        self.c.attachments.complete(att_id)
        LOG.info('attached %s on node %s in %.1f s: %s %s', volume_id,
                 node_key.upper(), time.monotonic() - t0,
                 info.get('driver_volume_type'), device.get('path'))
        return Attachment(att_id, volume_id, node_key, info, device,
                          instance)

    def attach_refused(self, volume_id, node_key, instance, props=None):
        """Nova attaching ``instance`` on ``node_key``: the refusal's text.

        ``props``: a connector other than the node's.  Fails unless Cinder
        refuses; an attachment record the refused
        request left behind is deleted (Nova's cleanup), so the volume
        keeps exactly the attachments it had.
        """
        before = {a.id for a in self.c.attachments.list(
            search_opts={'volume_id': volume_id})}
        try:
            self.c.attachments.create(
                volume_id, props or self.connector(node_key),
                instance_id=instance)
        except Exception as exc:
            LOG.info('attach of %s on node %s refused: %s', volume_id,
                     node_key.upper(), exc)
            return str(exc)
        finally:
            for att in self.c.attachments.list(
                    search_opts={'volume_id': volume_id}):
                if att.id not in before:
                    self._forget(att.id)
        raise AssertionError('attach of %s on node %s was not refused'
                             % (volume_id, node_key.upper()))

    def _forget(self, att_id):
        try:
            self.c.attachments.delete(att_id)
        except Exception:
            LOG.exception('could not delete attachment %s', att_id)

    def connect(self, info, node_key):
        """os-brick connect_volume with the connection info Cinder gave."""
        protocol = info['driver_volume_type'].upper()
        if protocol == 'ISCSI':
            assert self.topo.node(node_key).initiator_iqn, (
                'node %s has no iSCSI initiator in this layout' % node_key)
        return self.on_node(node_key, brick_connect, info)

    def detach(self, att):
        """Nova's detach: disconnect on the node, delete the attachment."""
        t0 = time.monotonic()
        self.on_node(att.node, brick_disconnect, att.connection_info,
                     att.device)
        self.c.attachments.delete(att.id)
        LOG.info('detached %s from node %s in %.1f s', att.volume_id,
                 att.node.upper(), time.monotonic() - t0)

    def write(self, att, seed, length, offset=0):
        """Write a pattern through the attachment, on its node; sha256."""
        return self.on_node(att.node, testbed.write_pattern_digest,
                            att.path, seed, length, offset)

    def sha256(self, att, offset, length):
        """sha256 of what the attachment reads there, on its node."""
        return self.on_node(att.node, testbed.sha256_of_device, att.path,
                            length, offset)

    def attachments(self, volume_id):
        return list(self.get(volume_id).attachments)

    # -- the CLI --------------------------------------------------------------

    def openstack(self, *args, timeout=300, output=True):
        """Run the ``openstack`` CLI against the testbed; JSON output."""
        argv = ['openstack', '--os-auth-type', 'admin_token',
                '--os-token', 'admin:admin', '--os-endpoint', services.API,
                '--os-volume-api-version', services.MICROVERSION]
        argv += list(args) + (['-f', 'json'] if output else [])
        t0 = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True,
                              timeout=timeout, env=self.stack._env())
        LOG.info('$ openstack %s (%.1f s, rc %d)', ' '.join(args),
                 time.monotonic() - t0, proc.returncode)
        if proc.returncode != 0:
            raise AssertionError('openstack %s failed (%d): %s'
                                 % (' '.join(args), proc.returncode,
                                    proc.stderr[-3000:]))
        return json.loads(proc.stdout) if proc.stdout.strip() else None


def opened(stack):
    """A :class:`Cloud` of ``stack`` with the default type, for a fixture."""
    c = Cloud(stack)
    c.ensure_volume_type()
    yield c
    c.close()
