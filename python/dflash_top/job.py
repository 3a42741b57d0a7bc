"""Where this process sits in a torchrun job: the launcher's variables read into the job tag a
session carries (in its hello and its stats file), so that `dflash-top attach --job` finds every
rank. The fields and rules are src/job.rs's; a process with no job (or a malformed variable,
which torch.distributed itself reports) has none."""

import socket
from typing import Any, Dict, Mapping, Optional


def job_tag(env: Mapping[str, str]) -> Optional[Dict[str, Any]]:
    """The job of a process with environment `env`: None for a plain run (`WORLD_SIZE` unset,
    or 1 with `RANK` unset or 0) and where the variables do not make a job."""
    try:
        world = int(env["WORLD_SIZE"]) if "WORLD_SIZE" in env else None
        rank = int(env["RANK"]) if "RANK" in env else None
        if world is None or rank is None or world < 1 or not 0 <= rank < world:
            return None
        if world == 1:
            return None
        local_rank = int(env.get("LOCAL_RANK", rank))
        port = int(env["MASTER_PORT"])
    except (KeyError, ValueError):
        return None
    addr = env.get("MASTER_ADDR", "127.0.0.1").strip()
    if not addr or not 0 < port < 65536:
        return None
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    return {
        "id": run_id if run_id and run_id != "none" else "%s:%d" % (addr, port),
        "rank": rank,
        "world": world,
        "local_rank": local_rank,
        "host": socket.gethostname(),
        "master_addr": addr,
        "master_port": port,
        "agent_store": env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
    }
