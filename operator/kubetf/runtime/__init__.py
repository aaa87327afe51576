"""The running operator: the controller that carries plans out (`controller.Controller`), queue positions, and the
kopf wiring (`handlers`) and process (`runner`), the only modules that import kopf. May use kubetf.cluster and
kubetf.core, never the command line."""
