"""The venv `make setup` builds sees Debian's pyverbs and the project's locked packages."""

import sys
from pathlib import Path


def test_pyverbs_imports_in_the_project_venv() -> None:
    import pyverbs.device

    assert Path(sys.prefix).name == ".venv"
    assert hasattr(pyverbs.device, "get_device_list")
    assert pyverbs.__file__ is not None
    assert "dist-packages" in pyverbs.__file__


def test_generated_device_plugin_stubs_import() -> None:
    from plugin.deviceplugin.api.v1beta1 import api_pb2, api_pb2_grpc

    assert api_pb2.DESCRIPTOR.package == "v1beta1"
    assert hasattr(api_pb2_grpc, "DevicePluginServicer")


def test_generated_dra_stubs_speak_the_kubelets_service_names() -> None:
    # the kubelet v0.34 dials these exact gRPC service names (its api.pb.go)
    from plugin.dra.api.dra.v1 import api_pb2 as v1
    from plugin.dra.api.dra.v1beta1 import api_pb2 as v1beta1
    from plugin.dra.api.pluginregistration.v1 import api_pb2 as registration

    assert v1.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == (
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    )
    assert v1beta1.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == (
        "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
    )
    assert registration.DESCRIPTOR.services_by_name["Registration"].full_name == (
        "pluginregistration.Registration"
    )
