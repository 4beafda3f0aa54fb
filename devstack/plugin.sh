#!/bin/bash
#
# devstack/plugin.sh: the cinder-dmclone devstack plugin.
#
#   enable_plugin cinder-dmclone https://opendev.org/x/cinder-dmclone
#
# On every node with c-vol enabled: load and check the kernel modules
# (stack pre-install), install the package (stack install), create the
# volume groups, install the rootwrap filter and write the backend section
# (stack post-config). On the node with c-api: create the volume type
# (stack extra). With tempest: point it at the type (stack test-config).
# See devstack/README.rst.

# Keep track of the xtrace state and turn it on for this plugin.
_XTRACE_DMCLONE=$(set +o | grep xtrace)
set -o xtrace

# shellcheck source=devstack/lib/cinder-dmclone
source "$(dirname "${BASH_SOURCE[0]}")/lib/cinder-dmclone"

if [[ "$1" == "stack" ]]; then
    case "$2" in
        pre-install)
            if is_service_enabled c-vol; then
                check_cinder_dmclone_settings
                load_cinder_dmclone_kernel_modules
            fi
            ;;
        install)
            if is_service_enabled c-vol; then
                install_cinder_dmclone
            fi
            ;;
        post-config)
            if is_service_enabled c-vol; then
                init_cinder_dmclone_volume_groups
                install_cinder_dmclone_rootwrap
                configure_cinder_dmclone_backend
            fi
            ;;
        extra)
            if is_service_enabled c-api; then
                create_cinder_dmclone_volume_type
            fi
            ;;
        test-config)
            if is_service_enabled tempest; then
                configure_tempest_for_cinder_dmclone
            fi
            ;;
    esac
fi

if [[ "$1" == "unstack" ]]; then
    if is_service_enabled c-vol; then
        remove_cinder_dmclone_handles
    fi
fi

if [[ "$1" == "clean" ]]; then
    if is_service_enabled c-vol; then
        clean_cinder_dmclone
    fi
fi

# Restore xtrace.
$_XTRACE_DMCLONE
