import time, json, os
from tests.kube.test_service_pods import *  # noqa

def test_debug(service, kube_node, web_port):
    manifest = proxy_manifest("pod-1", host=kube_node.host_ip, port=web_port)
    custom(service).create_namespaced_custom_object(*PLURAL[:2], PROXY_NAMESPACE, PLURAL[2], manifest)
    open("/tmp/debug-node.json", "w").write(json.dumps({"kubeconfig": str(kube_node.kubeconfig), "token": service.token, "url": service.url(), "web": web_port}))
    while not os.path.exists("/tmp/debug-stop"):
        time.sleep(2)
