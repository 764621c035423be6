"""Chrome trace export with brick's device timeline (placeholder until matching is written)."""


def export_chrome_trace(prof, path):
    raise NotImplementedError
