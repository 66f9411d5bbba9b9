"""Sub-commands `cluster`, `submit`, `status`, `logs` and `k8s`."""

from __future__ import annotations

import argparse
import json
import os
import sys

from fleetllm import cli_values
from fleetllm.cluster.bootstrap import DEFAULT_GCS_PORT, DEFAULT_RETRIES, DEFAULT_RETRY_INTERVAL_S


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add `cluster`, `submit`, `status`, `logs` and `k8s` to the fleetllm parser."""
    _add_cluster(sub)
    _add_jobs(sub)
    _add_k8s(sub)


# ------------------------------------------------------------------------------------------ cluster


def _node_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-cpus", "--cpus", dest="num_cpus", type=cli_values.non_negative_int,
                   help="CPUs this node offers (default: all)")
    p.add_argument("--num-gpus", "--gpus", dest="num_gpus", type=cli_values.non_negative_int,
                   help="GPUs this node offers (default: all)")
    p.add_argument("--object-store-memory", type=cli_values.positive_int,
                   help="object store size in bytes (default: Ray's)")
    p.add_argument("--node-ip-address", help="this node's IP address as the others reach it")
    p.add_argument("--temp-dir", help="Ray's temp/session folder for this node (default /tmp/ray)")
    p.add_argument("--block", action="store_true", help="stay in the foreground until the node stops")
    p.add_argument("--token", help="the cluster's auth token (default: $RAY_AUTH_TOKEN or ~/.ray/auth_token)")
    p.add_argument(
        "--ray-arg", action="append", default=[], metavar="FLAG",
        help="extra `ray start` flag, repeatable (e.g. --ray-arg=--dashboard-agent-listen-port=52366)",
    )


def _add_cluster(sub: argparse._SubParsersAction) -> None:
    cluster = sub.add_parser("cluster", help="start, join, wait for, inspect and stop Ray nodes")
    csub = cluster.add_subparsers(dest="cluster_command", metavar="ACTION")
    cluster.set_defaults(handler=lambda args: (cluster.print_help(), 2)[1])

    start = csub.add_parser("start", help="start a head (--head) or join one (--address HOST:PORT)")
    role = start.add_mutually_exclusive_group(required=True)
    role.add_argument("--head", action="store_true", help="start the head node of a new cluster")
    role.add_argument("--address", help="join the head at HOST:PORT (its GCS address)")
    _node_flags(start)
    start.add_argument("--port", type=cli_values.port, default=DEFAULT_GCS_PORT, help="head: GCS port (default 6379)")
    start.add_argument("--dashboard-host", help="head: dashboard bind address (0.0.0.0 to submit from elsewhere)")
    start.add_argument("--dashboard-port", type=cli_values.port, help="head: dashboard port (default 8265)")
    start.add_argument("--no-dashboard", action="store_true", help="head: no dashboard (no `fleetllm submit`)")
    start.add_argument("--retries", type=cli_values.positive_int, default=DEFAULT_RETRIES,
                       help="join: attempts (default 12)")
    start.add_argument("--retry-interval", type=cli_values.non_negative_float, default=DEFAULT_RETRY_INTERVAL_S,
                       help="join: seconds between attempts (default 5)")
    start.set_defaults(handler=_cmd_start)

    wait = csub.add_parser("wait", help="wait until the cluster has N GPUs and/or CPUs")
    wait.add_argument("--gpus", type=cli_values.non_negative_float, help="GPUs to wait for")
    wait.add_argument("--cpus", type=cli_values.non_negative_float, help="CPUs to wait for")
    wait.add_argument("--timeout", type=cli_values.positive_float, default=600.0,
                      help="seconds before giving up (default 600)")
    wait.add_argument("--address", help="the head's GCS address HOST:PORT (default $RAY_ADDRESS)")
    wait.add_argument("--token", help="the cluster's auth token")
    wait.set_defaults(handler=_cmd_wait)

    status = csub.add_parser("status", help="nodes, resources and what is running")
    status.add_argument("--address", help="the head's GCS address HOST:PORT (default $RAY_ADDRESS)")
    status.add_argument("--dashboard", help="the head's dashboard URL, to list running jobs too")
    status.add_argument("--token", help="the cluster's auth token")
    status.set_defaults(handler=_cmd_cluster_status)

    stop = csub.add_parser("stop", help="stop Ray on this machine")
    stop.add_argument("--temp-dir", help="stop only the node started with this --temp-dir")
    stop.add_argument("--force", action="store_true", help="SIGKILL instead of SIGTERM (without --temp-dir)")
    stop.set_defaults(handler=_cmd_stop)


def _cmd_start(args: argparse.Namespace) -> int:
    from fleetllm.cluster import auth, bootstrap

    common = dict(
        num_cpus=args.num_cpus,
        num_gpus=args.num_gpus,
        object_store_memory=args.object_store_memory,
        node_ip_address=args.node_ip_address,
        temp_dir=os.path.abspath(args.temp_dir) if args.temp_dir else None,
        block=args.block,
        extra_args=tuple(args.ray_arg),
    )
    if args.head:
        token = auth.ensure_head_token(args.token)
        opts = bootstrap.HeadOptions(
            port=args.port,
            include_dashboard=not args.no_dashboard,
            dashboard_host=args.dashboard_host,
            dashboard_port=args.dashboard_port,
            **common,
        )
        print(f"starting a Ray head on port {args.port} with token authentication (token from {token.source})",
              flush=True)
        code = bootstrap.start_head(opts, token)
        if code == 0 and not args.block:
            print(
                "join other machines with: fleetllm cluster start --address <this-ip>:"
                f"{args.port} (with this machine's ~/.ray/auth_token or $RAY_AUTH_TOKEN)",
                flush=True,
            )
        return code
    token = auth.require_token(args.token, for_what=f"joining {args.address}")
    bootstrap.join_cluster(
        args.address,
        bootstrap.NodeOptions(**common),
        token,
        retries=args.retries,
        interval_s=args.retry_interval,
    )
    return 0


def _cmd_wait(args: argparse.Namespace) -> int:
    from fleetllm.cluster.wait import connect, wait_for_resources

    connect(args.address, args.token)
    wait_for_resources(gpus=args.gpus, cpus=args.cpus, timeout_s=args.timeout, log=lambda s: print(s, flush=True))
    return 0


def _cmd_cluster_status(args: argparse.Namespace) -> int:
    from fleetllm.cluster import auth, bootstrap

    address = args.address or os.environ.get("RAY_ADDRESS")
    if not address or address.startswith("http"):
        from fleetllm.errors import FleetError

        raise FleetError("give --address HOST:PORT (the head's GCS address) or set $RAY_ADDRESS to it")
    token = auth.find_token(args.token)
    code = bootstrap.run_ray([bootstrap.ray_cli(), "status", "--address", address], token)
    if args.dashboard:
        from fleetllm.cluster.jobs import client

        jobs = client(args.dashboard, args.token).list_jobs()
        running = [j for j in jobs if str(getattr(j.status, "value", j.status)) in ("PENDING", "RUNNING")]
        print(f"\nJobs: {len(running)} running or pending of {len(jobs)}")
        for j in running:
            print(f"  {j.submission_id}  {getattr(j.status, 'value', j.status)}  {j.entrypoint}")
    return code


def _cmd_stop(args: argparse.Namespace) -> int:
    from fleetllm.cluster.bootstrap import stop_node

    return stop_node(os.path.abspath(args.temp_dir) if args.temp_dir else None, force=args.force)


# --------------------------------------------------------------------------------------------- jobs


def _address_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", help="the head's dashboard, http://HEAD:8265 (default $RAY_ADDRESS)")
    p.add_argument("--token", help="the cluster's auth token (default: $RAY_AUTH_TOKEN or ~/.ray/auth_token)")


def _add_jobs(sub: argparse._SubParsersAction) -> None:
    submit = sub.add_parser("submit", help="run a job on a remote Ray cluster (Ray Jobs API)")
    submit.add_argument("spec", nargs="?", help="job YAML, inside the working directory")
    _address_flags(submit)
    submit.add_argument("--working-dir", default=".", help="folder uploaded as the job's working_dir (default .)")
    submit.add_argument("--entrypoint", help="command to run instead of `python -m fleetllm run SPEC`")
    submit.add_argument("--submission-id", help="the run id (default fleetllm-<name>-<random>)")
    submit.add_argument("--follow", action="store_true", help="stream the logs until the run ends")
    submit.set_defaults(handler=_cmd_submit)

    status = sub.add_parser("status", help="the status of a submitted run")
    status.add_argument("run_id", help="the id printed by `fleetllm submit`")
    _address_flags(status)
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(handler=_cmd_status)

    stop = sub.add_parser("stop", help="stop a submitted run (as `ray job stop`); what it committed stays")
    stop.add_argument("run_id", help="the id printed by `fleetllm submit`")
    _address_flags(stop)
    stop.add_argument("--no-wait", action="store_true", help="return once asked, without waiting for STOPPED")
    stop.add_argument("--timeout", type=cli_values.non_negative_float, default=60.0,
                      help="seconds to wait for the run to stop (default 60)")
    stop.set_defaults(handler=_cmd_stop_run)

    logs = sub.add_parser("logs", help="the output of a submitted run")
    logs.add_argument("run_id", help="the id printed by `fleetllm submit`")
    _address_flags(logs)
    logs.add_argument("--follow", "-f", action="store_true", help="stream until the run ends")
    logs.set_defaults(handler=_cmd_logs)


def _cmd_submit(args: argparse.Namespace) -> int:
    from fleetllm.cluster import jobs
    from fleetllm.errors import FleetError

    if not args.spec and not args.entrypoint:
        raise FleetError("give a job YAML (fleetllm submit job.yaml --address http://HEAD:8265) or --entrypoint")
    job_name = None
    if args.spec and not args.entrypoint:
        from fleetllm.spec import load_job_spec

        job_name = load_job_spec(args.spec).name
    plan = jobs.plan_submission(args.spec or "job", args.working_dir, entrypoint=args.entrypoint,
                                submission_id=args.submission_id, job_name=job_name)
    run_id = jobs.submit(plan, args.address, args.token)
    print(run_id, flush=True)
    print(f"follow it with: fleetllm logs {run_id} --follow --address {jobs.dashboard_address(args.address)}",
          file=sys.stderr)
    if args.follow:
        jobs.follow_logs(run_id, args.address, args.token)
        return 0 if jobs.status(run_id, args.address, args.token)["status"] == "SUCCEEDED" else 1
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from fleetllm.cluster import jobs

    info = jobs.status(args.run_id, args.address, args.token)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        for key, value in info.items():
            if value is not None:
                print(f"{key}: {value}")
    return 0


def _cmd_stop_run(args: argparse.Namespace) -> int:
    from fleetllm.cluster import jobs

    if not jobs.stop(args.run_id, args.address, args.token):
        state = jobs.status(args.run_id, args.address, args.token)["status"]
        print(f"{args.run_id}: already {state}")
        return 0
    if args.no_wait:
        print(f"{args.run_id}: stop requested")
        return 0
    print(f"{args.run_id}: {jobs.wait_finished(args.run_id, args.address, args.timeout, args.token)}")
    return 0


def _cmd_logs(args: argparse.Namespace) -> int:
    from fleetllm.cluster import jobs

    if args.follow:
        jobs.follow_logs(args.run_id, args.address, args.token)
    else:
        sys.stdout.write(jobs.logs(args.run_id, args.address, args.token))
    return 0


# ---------------------------------------------------------------------------------------------- k8s


def _add_k8s(sub: argparse._SubParsersAction) -> None:
    k8s = sub.add_parser("k8s", help="Kubernetes manifests (KubeRay, Gateway API, AIBrix)")
    ksub = k8s.add_subparsers(dest="k8s_command", metavar="ACTION")
    k8s.set_defaults(handler=lambda args: (k8s.print_help(), 2)[1])
    render = ksub.add_parser("render", help="write manifests for a job or serve YAML")
    render.add_argument("spec", help="job YAML (-> RayJob) or serve YAML with `models:` (-> RayService)")
    render.add_argument("-o", "--output", default="k8s", help="folder for the manifests (default ./k8s)")
    render.add_argument("--image", default="fleetllm:0.1.0", help="container image with fleetllm and Ray installed")
    render.add_argument("--namespace", help="Kubernetes namespace of the resources")
    render.add_argument("--replicas", type=cli_values.positive_int,
                        help="job: worker pods when compute.replicas is 'auto'")
    render.add_argument("--fleet", action="store_true", help="serve: AIBrix RayClusterFleet(s) instead of a RayService")
    render.add_argument("--max-surge", default="1", help="fleet: rolling update maxSurge (number or percent)")
    render.add_argument("--max-unavailable", default="0", help="fleet: rolling update maxUnavailable")
    render.add_argument(
        "--gateway", default="aibrix-system/aibrix-eg", help="serve: the HTTPRoute's Gateway as [NAMESPACE/]NAME"
    )
    render.set_defaults(handler=_cmd_render)


def _int_or_percent(value: str) -> int | str:
    return int(value) if value.isdigit() else value


def _cmd_render(args: argparse.Namespace) -> int:
    from fleetllm.cluster.k8s import is_serve_spec, job_path_notes, render_spec_file, write_manifests
    from fleetllm.cluster.k8s_pods import RenderOptions
    from fleetllm.cluster.k8s_secrets import secret_note
    from fleetllm.spec import JobSpec, load_yaml, parse_spec

    opts = RenderOptions(image=args.image, namespace=args.namespace)
    namespace, _, gateway = args.gateway.rpartition("/")
    extra: dict = {"gateway": gateway, "gateway_namespace": namespace or args.namespace or "default"}
    if args.fleet:
        extra.update(max_surge=_int_or_percent(args.max_surge), max_unavailable=_int_or_percent(args.max_unavailable))
    manifests = render_spec_file(args.spec, opts, fleet=args.fleet, replicas=args.replicas, **extra)
    data = load_yaml(args.spec)
    if not is_serve_spec(data):
        for note in job_path_notes(parse_spec(JobSpec, data, args.spec)):
            print(f"note: {note}", file=sys.stderr)
    note = secret_note(manifests)
    if note:
        print(f"note: {note}", file=sys.stderr)
    for path in write_manifests(manifests, args.output):
        print(path)
    return 0
