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

"""What Cinder's volume manager does around a driver's connections.

Every harness that drives a node (the two-node unit model, the functional
testbed's node workers, the peer socket that stands in for RPC) calls the
driver the way ``cinder.volume.manager.VolumeManager`` does, through these
functions, so that the sequence exists once in the tests.
"""

from oslo_utils import excutils


def initialize_connection(driver, ctxt, volume, connector, save):
    """VolumeManager.initialize_connection (and attachment_update's part).

    The connector is validated, the export created and its model update
    saved (``save(volume, update)``), then the connection initialized;
    the export goes again if that fails.
    """
    driver.validate_connector(connector)
    update = driver.create_export(ctxt, volume, connector)
    if update:
        save(volume, update)
    try:
        return driver.initialize_connection(volume, connector)
    except Exception:
        with excutils.save_and_reraise_exception():
            driver.remove_export(ctxt, volume)


def terminate_connection(driver, ctxt, volume, connector):
    """VolumeManager.attachment_delete's driver calls.

    The export is removed unless the driver says the target is still
    shared by another attachment.  Returns that answer.
    """
    shared = driver.terminate_connection(volume, connector, force=False)
    if not shared:
        driver.remove_export(ctxt, volume)
    return shared


def migrate_volume(driver, ctxt, volume, host, save, zone):
    """VolumeManager.migrate_volume's driver-assisted part (Cinder 29).

    Runs on the service of the volume's host.  The driver is asked only
    for a volume without attachments (Nova copies an attached one); an
    error it raises ends the migration (``migration_status`` error, no
    generic copy); (True, update): the manager points the volume at
    ``host`` (its service's ``zone``), with the driver's model update.
    Returns whether the driver moved it; False is Cinder's generic copy,
    which no harness models.

    A volume the API left ``maintenance`` (``migrate --lock-volume
    True``) or ``retyping`` (a retype the driver may migrate) gets its
    ``previous_status`` back only after the driver returned or raised:
    the driver sees it so.
    """
    status_update = {}
    if volume.status in ('retyping', 'maintenance'):
        status_update = {'status': volume.previous_status}
    save(volume, {'migration_status': 'migrating'})
    if len(volume.volume_attachment):
        return False
    try:
        moved, update = driver.migrate_volume(ctxt, volume, host)
    except Exception:
        with excutils.save_and_reraise_exception():
            save(volume, dict(status_update, migration_status='error'))
    if moved:
        updates = {'host': host['host'], 'availability_zone': zone,
                   'migration_status': 'success',
                   'previous_status': volume.status}
        updates.update(status_update)
        updates.update(update or {})
        save(volume, updates)
    return moved
