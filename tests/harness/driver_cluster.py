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

"""Two nodes' volume services and the API side's records, for the tests.

The pytest process plays Cinder's API and Nova: it creates volume and
attachment records in the shared database and routes each request to the
worker of the node the volume record names, as the volume RPC API would.
It looks at a node's kernel (its LVs, LIO targets, the data of its
devices) through :meth:`Cluster.on_node`, which is a plain call in the
one-kernel layout and a call in a worker on that node when the node has
a kernel of its own.
"""

import os
import uuid

from tests.harness import testbed
from tests.harness import volume_node
from tests.harness import workers


def device_node(topo, path):
    """The node whose kernel holds ``path``: a handle or LV of its VGs.

    ``/dev/mapper/dmclone-<vg>-volume-...`` (the VG's dashes doubled, as
    device-mapper names show them) or ``/dev/<vg>/...``, for the VGs the
    topology gives each node.  Anything else is refused: which kernel
    holds it cannot be told from its name.
    """
    for key, node in sorted(topo.nodes.items()):
        for vg in (node.vg, node.meta_vg):
            if vg and (path.startswith('/dev/%s/' % vg) or path.startswith(
                    '/dev/mapper/dmclone-%s-volume-'
                    % vg.replace('-', '--'))):
                return key
    raise ValueError('%s is no handle or LV of a node\'s volume groups'
                     % path)


class Cluster(object):

    def __init__(self, control_plane=None):
        """Both nodes' services, none started yet.

        ``control_plane``: the session's :class:`services.Stack`, whose
        volume services must not run beside these (:meth:`ensure_running`).
        """
        self.control_plane = control_plane
        self.workers = {}
        self.nodes = workers.NodeCalls()

    # -- services ----------------------------------------------------------

    def start(self, key, overrides=None, env=None):
        """Start node ``key``'s volume service (driver option overrides).

        ``env`` is added to the service's environment, as a node's own
        settings would be (``LVM_SYSTEM_DIR``: the node's LVM
        configuration).
        """
        worker = workers.NodeProcess(key, env=env)
        worker.start()
        try:
            worker.info['driver'] = worker.call(volume_node.start_driver,
                                                key, overrides)
        except Exception:
            worker.close()
            raise
        self.workers[key] = worker
        return worker

    def alive(self, key):
        worker = self.workers.get(key)
        return worker is not None and worker.proc is not None \
            and worker.proc.poll() is None

    def forget(self, key):
        """Drop a worker that died (a kill -9 injected in it)."""
        worker = self.workers.pop(key, None)
        if worker is not None:
            if worker.proc is not None:
                worker.proc.wait()
            worker.close()

    def ensure_running(self):
        """Both nodes' services run, and only theirs: before every test.

        The full stack's volume services (the session's, when a module
        of the stack ran before) act on the same volume groups and LIO
        targets: they are stopped, and the stack's fixtures start them
        again before its next test (:func:`services.keep_running`).  A
        worker that is gone, or on separate kernels does not answer (its
        node powered off or rebooted by a test of the stack), is started
        again; so are the workers that look at the nodes.
        """
        if self.control_plane is not None:
            self.control_plane.stop_volumes()
        self.nodes.forget_silent()
        for key in volume_node.NODES:
            worker = self.workers.get(key)
            if worker is None or not worker.answers():
                self.forget(key)
                self.start(key)

    def stop(self, key, kill=False):
        worker = self.workers.pop(key, None)
        if worker is None:
            return
        if kill:
            worker.kill()
        else:
            try:
                worker.call(volume_node.stop_driver)
            finally:
                worker.close()

    def reboot(self, key):
        """Node ``key`` reboots; returns the device-mapper handles it had.

        It loses its service and its kernel's state.  Separate kernels: a
        hard power-off and a boot, its disks (VGs, LIO's saved
        configuration) kept.  One kernel: node A's reboot simulated
        (:func:`testbed.reboot_a`).  The service is not started again.
        """
        self.stop(key, kill=True)
        if not testbed.topology().separate:
            assert key == 'a', 'one kernel: only node A can reboot'
            return testbed.reboot_a()
        handles = self.on_node(key, testbed.handles, key)
        self.nodes.forget(key)
        testbed.power_off(key)
        testbed.boot(key)
        return handles

    def close(self):
        for key in list(self.workers):
            self.stop(key)
        self.nodes.close()

    def __getitem__(self, key):
        return self.workers[key]

    # -- the nodes' kernels --------------------------------------------------

    def on_node(self, key, fn, *args):
        """``fn(*args)`` on node ``key``'s kernel (see the module's doc)."""
        return self.nodes.call(key, fn, *args)

    def on_each(self, fn, *args):
        """{node: ``fn(*args)`` on its kernel} for both nodes."""
        return {key: self.on_node(key, fn, *args)
                for key in volume_node.NODES}

    def write(self, path, offset, data):
        """Write ``data`` at ``offset`` of a node's handle or LV (O_DIRECT)."""
        self.on_node(device_node(testbed.topology(), path),
                     testbed.write_direct, path, offset, data)

    def read(self, path, offset, length):
        return self.on_node(device_node(testbed.topology(), path),
                            testbed.read_direct, path, offset, length)

    def sha256(self, path, length=None, offset=0):
        return self.on_node(device_node(testbed.topology(), path),
                            testbed.sha256_of_device, path, length, offset)

    def exists(self, path):
        return self.on_node(device_node(testbed.topology(), path),
                            os.path.exists, path)

    # -- records -----------------------------------------------------------

    @staticmethod
    def ctxt():
        from cinder import context
        return context.get_admin_context()

    def volume(self, volume_id):
        from cinder import objects
        return objects.Volume.get_by_id(self.ctxt(), volume_id)

    def node_of(self, volume_id):
        host = self.volume(volume_id).host
        for key in ('a', 'b'):
            if host.startswith(volume_node.service_host(key)):
                return key
        raise AssertionError('volume %s has host %r' % (volume_id, host))

    def on_volume_node(self, volume_id, fn, *args, **kwargs):
        """Run ``fn`` in the worker of the node the record names (RPC)."""
        return self.workers[self.node_of(volume_id)].call(fn, *args,
                                                          **kwargs)

    def create_volume(self, node_key, size_gb=1, method='create_volume',
                      source_id=None):
        """A new volume record and the driver's create on ``node_key``.

        ``method`` may be create_cloned_volume or create_volume_from_snapshot
        with the source volume or snapshot in ``source_id``.
        """
        from cinder import objects
        ctxt = self.ctxt()
        vtype = objects.VolumeType.get_by_name_or_id(ctxt, '__DEFAULT__')
        volume = objects.Volume(
            ctxt, size=size_gb, host=volume_node.volume_host(node_key),
            status='creating', attach_status='detached',
            availability_zone='nova', volume_type_id=vtype.id,
            project_id='test', user_id='test')
        volume.create()
        self.workers[node_key].call(volume_node.create, method, volume.id,
                                    source_id)
        volume.status = 'available'
        volume.save()
        return volume.id

    def delete_volume(self, volume_id):
        self.on_volume_node(volume_id, volume_node.call, 'delete_volume',
                            volume_id)
        volume = self.volume(volume_id)
        volume.destroy()

    def set_size(self, volume_id, size_gb):
        volume = self.volume(volume_id)
        volume.size = size_gb
        volume.save()

    def create_snapshot(self, volume_id):
        from cinder import objects
        volume = self.volume(volume_id)
        snap = objects.Snapshot(
            self.ctxt(), volume_id=volume_id, volume_size=volume.size,
            status='creating', project_id='test', user_id='test',
            volume_type_id=volume.volume_type_id)
        snap.create()
        self.on_volume_node(volume_id, volume_node.snapshot_call,
                            'create_snapshot', snap.id)
        snap.status = 'available'
        snap.save()
        return snap.id

    def delete_snapshot(self, snapshot_id):
        from cinder import objects
        snap = objects.Snapshot.get_by_id(self.ctxt(), snapshot_id)
        self.on_volume_node(snap.volume_id, volume_node.snapshot_call,
                            'delete_snapshot', snapshot_id)
        snap.destroy()

    def forget_snapshots(self, volume_id):
        from cinder import objects
        for snap in objects.SnapshotList.get_all_for_volume(self.ctxt(),
                                                            volume_id):
            snap.destroy()

    def use_type(self, volume_id, name, extra_specs, retype_on=None):
        """Give the volume a type with ``extra_specs`` (retyping it)."""
        from cinder.db import api as db
        from cinder import exception
        from cinder.volume import volume_types
        ctxt = self.ctxt()
        try:
            vtype = volume_types.get_volume_type_by_name(ctxt, name)
        except exception.VolumeTypeNotFoundByName:
            vtype = volume_types.create(ctxt, name, extra_specs)
        db.volume_type_extra_specs_update_or_create(ctxt, vtype['id'],
                                                    extra_specs)
        if retype_on:
            self.workers[retype_on].call(volume_node.retype, volume_id,
                                         vtype['id'])
        volume = self.volume(volume_id)
        volume.volume_type_id = vtype['id']
        volume.save()

    def reserve(self, volume_id, instance=True):
        from cinder import objects
        attachment = objects.VolumeAttachment(
            self.ctxt(), volume_id=volume_id,
            instance_uuid=str(uuid.uuid4()) if instance else None,
            attach_status='reserved', attach_mode='rw')
        attachment.create()
        return attachment.id

    def attach(self, volume_id, node_key, instance=True):
        """Nova's attach from ``node_key``; returns (attachment, path)."""
        from cinder import objects
        attachment_id = self.reserve(volume_id, instance)
        try:
            info = self.on_volume_node(volume_id, volume_node.attach,
                                       volume_id, attachment_id,
                                       self.connector(node_key))
        except Exception:
            objects.VolumeAttachment.get_by_id(self.ctxt(),
                                               attachment_id).destroy()
            raise
        return attachment_id, info

    def complete(self, volume_id, attachment_id):
        """Nova's attachment_complete once the instance uses the volume.

        As Cinder's API does: the attachment ``attached``, the volume
        ``in-use``.  (The manager's attachment_update leaves both in
        ``attaching``; Nova completes a live migration's new attachment
        only after the switch-over.)
        """
        from cinder import objects
        ctxt = self.ctxt()
        attachment = objects.VolumeAttachment.get_by_id(ctxt, attachment_id)
        assert attachment.volume_id == volume_id, attachment
        attachment.update({'attach_status': 'attached'})
        attachment.save()
        volume = objects.Volume.get_by_id(ctxt, volume_id)
        volume.update({'status': 'in-use', 'attach_status': 'attached'})
        volume.save()

    def detach(self, volume_id, attachment_id):
        """Nova's detach (the manager's volume_detached drops the record)."""
        self.on_volume_node(volume_id, volume_node.detach, volume_id,
                            attachment_id)

    @staticmethod
    def connector(node_key):
        """The connector Nova's compute on ``node_key`` sends."""
        node = testbed.topology().node(node_key)
        return {'host': node.name, 'ip': node.ip,
                'initiator': node.initiator_iqn, 'platform': 'x86_64',
                'os_type': 'linux', 'multipath': False,
                'do_local_attach': False}

    def admin_metadata(self, volume_id):
        from cinder.db import api as db
        return db.volume_admin_metadata_get(self.ctxt(), volume_id)


def setup_database():
    volume_node.create_database()
    volume_node.register_services()
