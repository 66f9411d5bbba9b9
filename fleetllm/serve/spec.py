"""serve.yaml (ServeSpec) and the Ray Serve LLM-shaped LLMConfig it becomes.

    name: smollm2
    host: 127.0.0.1
    port: 8000
    api_key: null                  # or a string (printable ASCII), $FLEETLLM_API_KEY, {secretKeyRef: {name, key}}
    ingress: auto                  # direct (the model replica serves HTTP) | separate (OpenAIIngress) | auto
    http: auto                     # replica (it listens on host:port itself, no Serve proxy) | proxy | auto
    models:
      - model_id: smollm2
        source: smollm2-135m-instruct
        engine: transformers       # transformers | vllm | auto
        task: auto                 # generate | embed | auto (from the model: embedding models embed)
        replicas: 1                # or autoscaling: {min_replicas, max_replicas, target_ongoing_requests}
        routing: power_of_two      # or prefix_affinity: a shared prompt prefix goes to the replica that cached it
        max_ongoing_requests: 32
        max_queued_requests: 64
    cluster: {address: null}
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from fleetllm import sizing
from fleetllm.errors import SpecError
from fleetllm.secrets import API_KEY_ENV, SecretRef, check_api_key
from fleetllm.serve.replica_http import HttpMode, choose_http
from fleetllm.spec import ClusterSpec, EnvironmentSpec, StrictModel, load_yaml, parse_spec

log = logging.getLogger("fleetllm.serve")


class AutoscalingSpec(StrictModel):
    min_replicas: int = Field(1, ge=0, description="Fewest replicas kept running (0 scales to zero).")
    max_replicas: int = Field(1, ge=1, description="Most replicas started under load.")
    target_ongoing_requests: float = Field(
        16, gt=0, description="Ongoing requests per replica that Ray Serve's autoscaler aims for."
    )

    @model_validator(mode="after")
    def _ordered(self) -> "AutoscalingSpec":
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"autoscaling.min_replicas ({self.min_replicas}) is above max_replicas "
                             f"({self.max_replicas}); make min_replicas <= max_replicas")
        return self


class ServedEngineSpec(StrictModel):
    """The engine settings of one served model, shared by serve.yaml's models and LLMConfig."""

    engine: Literal["transformers", "vllm", "auto"] = Field(
        "auto", description="Inference engine: transformers, vllm, or auto (vLLM when it is installed and the "
        "replica has GPUs, fleetllm.sizing.choose_engine)."
    )
    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments passed to the engine.")
    task: Literal["auto", "generate", "embed"] = Field(
        "auto", description="What the model serves: generate (chat and completions), embed (POST /v1/embeddings), "
        "or auto: embed for an embedding model (all-minilm-l6-v2, a sentence-transformers folder), else generate.")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Default chat template variables, e.g. {enable_thinking: false}."
    )
    stream_messages_per_s: float | None = Field(
        None, gt=0, description="Most streaming messages a replica sends per second, all its streams together: "
        "each stream gets one message per streams / this seconds (every delta at once while that is shorter than "
        "the engine's step). Default: 40 on a CPU replica (where every message's CPU is taken from the model); on a "
        "GPU replica 6,000 on the direct path (what the HTTP proxy carries) and 2,000 behind the separate ingress.",
    )
    lora_adapters: dict[str, str] = Field(
        default_factory=dict, description="LoRA adapters served over this model, {name: source} (a local folder, an "
        "object-store URL or a hub id of a peft adapter); each is a model id of its own in /v1/models, also "
        "reachable as `<model_id>:<name>`.")
    enable_prompt_tokens_details: bool = Field(
        False, description="Add usage.prompt_tokens_details ({cached_tokens}: prompt tokens found in the prefix "
        "cache; 0 on transformers, which has none) to every response, as `vllm serve "
        "--enable-prompt-tokens-details` does; off, usage has no prompt_tokens_details.")
    routing: Literal["power_of_two", "prefix_affinity"] = Field(
        "power_of_two", description="How requests pick a replica: power_of_two (Ray Serve's default: the less "
        "loaded of two) or prefix_affinity (requests sharing a prompt prefix go to the replica that cached it, "
        "Ray Serve LLM's PrefixCacheAffinityRouter; for several replicas serving conversations or few-shot prompts).")


    @field_validator("lora_adapters")
    @classmethod
    def _adapter_names(cls, value: dict[str, str]) -> dict[str, str]:
        from fleetllm.adapters import check_names

        check_names(value)
        return value


class ServeModelSpec(ServedEngineSpec):
    model_id: str = Field(..., min_length=1, description="The `model` name clients send.")
    source: str = Field("smollm2-135m-instruct", description="Model alias, a local folder, or a Hugging Face id.")
    replicas: int = Field(1, ge=1, description="Fixed number of replicas (ignored when autoscaling is given).")
    autoscaling: AutoscalingSpec | None = Field(None, description="Ray Serve autoscaling instead of fixed replicas.")
    max_ongoing_requests: int = Field(32, ge=1, description="Requests a replica serves at once (its batch).")
    max_queued_requests: int = Field(
        64, ge=0, description="Requests waiting per replica; past it clients get 429 with Retry-After."
    )
    cpus_per_replica: float = Field(1.0, ge=0, description="CPUs reserved per replica.")
    gpus_per_replica: float = Field(0.0, ge=0, description="GPUs reserved per replica.")

    def to_llm_config(self) -> "LLMConfig":
        deployment: dict[str, Any] = {
            "max_ongoing_requests": self.max_ongoing_requests,
            "max_queued_requests": self.max_queued_requests,
            "ray_actor_options": {"num_cpus": self.cpus_per_replica, "num_gpus": self.gpus_per_replica},
        }
        if self.autoscaling is not None:
            deployment["autoscaling_config"] = self.autoscaling.model_dump()
        else:
            deployment["num_replicas"] = self.replicas
        return LLMConfig(
            model_loading_config=ModelLoadingConfig(model_id=self.model_id, model_source=self.source),
            deployment_config=deployment, **self.model_dump(include=set(ServedEngineSpec.model_fields)),
        )


IngressMode = Literal["auto", "direct", "separate"]


class BatchesSpec(StrictModel):
    """The OpenAI Batch API (`/v1/files`, `/v1/batches`) of the app (docs/batch-api.md)."""

    enabled: bool = Field(True, description="Serve /v1/files and /v1/batches and run the batches.")
    path: str | None = Field(
        None, description="Folder or object-store prefix (s3://...) holding the uploaded files, the batches' "
        "state and their jobs' output; default: $FLEETLLM_HOME/batches/<app name>.")
    shard_rows: int = Field(100, ge=1, description="Requests per shard of a batch's job: the unit of commit (what a "
                            "restart keeps and a cancel keeps as partial output).")
    max_in_flight: int | None = Field(
        None, ge=1, description="Most batch requests in flight per model (the AIMD window's ceiling; the window "
        "shrinks when latency rises). Default: half of the model's replicas x max_ongoing_requests, so "
        "interactive requests always find room.")

    def store_url(self, app_name: str) -> str:
        if self.path:
            return self.path
        from fleetllm.models import fleetllm_home

        return str(fleetllm_home() / "batches" / app_name)


def choose_ingress(ingress: str, models: list[Any]) -> tuple[str, str]:
    """The path an app takes: ("direct" | "separate", why). `models` are ServeModelSpecs or LLMConfigs.

    direct: the one model's deployment is the Serve ingress (its replicas answer HTTP themselves); separate:
    an OpenAIIngress deployment in front routes by `model` over DeploymentHandles. auto = direct where it
    applies: one model with the default routing. Raises ValueError for direct where it cannot apply."""
    blockers = []
    if len(models) > 1:
        blockers.append(f"the app serves {len(models)} models ({', '.join(m.model_id for m in models)}) and the "
                        "separate ingress routes by `model`")
    affine = [m.model_id for m in models if m.routing == "prefix_affinity"]
    if affine:
        blockers.append(f"model {', '.join(affine)} uses routing: prefix_affinity, which routes on the request body "
                        "in the separate ingress")
    if ingress == "direct" and blockers:
        raise ValueError("ingress: direct cannot serve this app: " + "; ".join(blockers)
                         + "; use ingress: auto or separate")
    if ingress != "auto":
        return ingress, f"as `ingress: {ingress}` asks"
    if blockers:
        return "separate", "auto: " + "; ".join(blockers)
    return "direct", "auto: one model with the default routing"


class ServeSpec(StrictModel):
    name: str = Field("fleetllm", min_length=1, description="Ray Serve application name.")
    host: str = Field("127.0.0.1", description="Address the HTTP server listens on (0.0.0.0 for all).")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port; the API is under /v1.")
    api_key: str | SecretRef | None = Field(
        None, description="Bearer token clients must send (printable ASCII, no spaces); default: $FLEETLLM_API_KEY. "
        "Or {secretKeyRef: {name, key}}: a Kubernetes Secret, read from $FLEETLLM_API_KEY where it is set "
        "(fleetllm k8s render sets it on the pods).")
    ingress: IngressMode = Field(
        "auto", description="Which deployment answers HTTP: direct (the model's own replicas: one Ray hop and no "
        "ingress process per streamed message; one model with the default routing only), separate (an "
        "OpenAIIngress deployment in front, routing by `model`; needed for several models or prefix_affinity), "
        "or auto: direct where it applies, else separate.")
    http: HttpMode = Field(
        "auto", description="Who listens on host:port: replica (the one model replica itself, as `vllm serve`'s API "
        "process does: no Serve proxy hop per streamed message; the direct path, one fixed replica, a Ray started "
        "by `fleetllm serve`), proxy (Ray Serve's HTTP proxy), or auto: replica where it applies "
        "(fleetllm.serve.replica_http).")
    models: list[ServeModelSpec] = Field(..., min_length=1, description="The models served, routed by `model`.")
    cluster: ClusterSpec = Field(default_factory=ClusterSpec, description="Which Ray cluster.")
    environment: EnvironmentSpec = Field(default_factory=EnvironmentSpec,
                                         description="pip, env_vars, working_dir: Ray's runtime_env for the replicas.")
    batches: BatchesSpec = Field(default_factory=BatchesSpec, description="The OpenAI Batch API: where its files "
                                 "and state live, shard size, in-flight ceiling.")

    @model_validator(mode="after")
    def _unique_ids(self) -> "ServeSpec":
        ids = [m.model_id for m in self.models]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"models: model_id {dup} appears more than once; give each model its own id")
        path, _ = choose_ingress(self.ingress, self.models)
        choose_http(self.http, path, self.models, ray_here=True)  # where Ray runs is known only at start
        return self

    @field_validator("api_key")
    @classmethod
    def _usable_key(cls, value: str | SecretRef | None) -> str | SecretRef | None:
        return check_api_key(value, "api_key") if isinstance(value, str) else value

    def effective_api_key(self) -> str | None:
        """The key clients must send: api_key, else $FLEETLLM_API_KEY (where api_key names a Secret, the
        variable its pods get); SpecError when it is unusable or the Secret's variable is not set."""
        if isinstance(self.api_key, str):
            return self.api_key
        env = os.environ.get(API_KEY_ENV) or None  # set but empty: no key, as before
        if env is None and isinstance(self.api_key, SecretRef):
            ref = self.api_key.secretKeyRef
            raise SpecError(f"api_key names the Kubernetes Secret {ref.name!r} (key {ref.key!r}), which only pods "
                            f"rendered by `fleetllm k8s render` read (as ${API_KEY_ENV}); set ${API_KEY_ENV} here")
        try:
            return check_api_key(env, f"${API_KEY_ENV}") if env is not None else None
        except ValueError as exc:
            raise SpecError(str(exc)) from None

    def batch_store_url(self) -> str | None:
        """Where the Batch API keeps its files and state; None when it is off."""
        return self.batches.store_url(self.name) if self.batches.enabled else None

    def batch_models(self) -> dict[str, dict[str, Any]]:
        """model id -> {task, max_in_flight}: what the batch service validates and sends against; a LoRA
        adapter's model ids (its name, `<model_id>:<name>`) are its base model's."""
        from fleetllm import models
        from fleetllm.adapters import model_ids

        out = {}
        for m in self.models:
            task = m.task
            if task == "auto":
                try:
                    task = models.model_task(models.resolve(m.source, pull_missing=False))
                except Exception:  # noqa: BLE001 - not resolvable here (the replicas fetch it): a generate model
                    task = "generate"
            replicas = m.autoscaling.max_replicas if m.autoscaling else m.replicas
            window = self.batches.max_in_flight or max(1, replicas * m.max_ongoing_requests // 2)
            out[m.model_id] = {"task": task, "max_in_flight": window}
        for adapter_id, (base, _) in model_ids({m.model_id: m.lora_adapters for m in self.models}).items():
            out.setdefault(adapter_id, dict(out[base]))
        return out

    def llm_configs(self) -> list["LLMConfig"]:
        configs = [m.to_llm_config() for m in self.models]
        env = self.environment.runtime_env()
        for cfg in configs if env else []:  # the replicas run in the spec's environment
            cfg.deployment_config["ray_actor_options"]["runtime_env"] = env
        return configs


class ModelLoadingConfig(StrictModel):
    model_id: str = Field(..., min_length=1, description="The `model` name clients send.")
    model_source: str = Field("smollm2-135m-instruct", description="Model alias, local folder or hub id.")


# A CPU replica's default message budget: a message costs about 2-3 ms of CPU in the replica, the
# ingress, the HTTP proxy and the client together, taken from the model on a CPU machine; 40 a second
# keeps that near 5% of two cores (benchmarks/NOTES-serve.md).
CPU_STREAM_MESSAGES_PER_S = 40.0
# A GPU replica's: the transport's CPU is not the model's there, but each message still passes the HTTP proxy
# and the ingress (one Python process each, ~0.3-0.5 ms a message on a server core): 2,000 a second keeps
# the ingress below one core, per token up to ~10 streams at 5 ms steps (benchmarks/NOTES-serve.md).
GPU_STREAM_MESSAGES_PER_S = 2000.0
# A GPU replica's on the direct path (the replica is the ingress): no ingress process and one Ray hop less;
# what remains per message is the replica's SSE chunk and the HTTP proxy (~0.15 ms a message on a server
# core, and Serve merges a request's queued ASGI messages when the proxy lags): 6,000 a second keeps one
# message per token up to ~36 streams at 6 ms steps (benchmarks/NOTES-serve.md, change 8). With `http: replica`
# (fleetllm.serve.replica_http) no proxy carries them: the budget then only bounds the replica's own loop.
GPU_DIRECT_STREAM_MESSAGES_PER_S = 6000.0

DEPLOYMENT_KEYS = {"num_replicas", "autoscaling_config", "max_ongoing_requests", "max_queued_requests",
                   "ray_actor_options", "health_check_period_s", "health_check_timeout_s",
                   "graceful_shutdown_timeout_s"}


class LLMConfig(ServedEngineSpec):
    """One served model, in Ray Serve LLM's shape.

    Example:
        >>> from fleetllm.serve import LLMConfig, build_openai_app
        >>> cfg = LLMConfig(model_loading_config=dict(model_id="smollm2", model_source="smollm2-135m-instruct"),
        ...                 deployment_config=dict(autoscaling_config=dict(min_replicas=1, max_replicas=2)),
        ...                 engine_kwargs=dict(max_model_len=2048))
        >>> app = build_openai_app({"llm_configs": [cfg]})   # then ray.serve.run(app)
    """

    model_loading_config: ModelLoadingConfig = Field(..., description="model_id (routing name) and model_source.")
    deployment_config: dict[str, Any] = Field(
        default_factory=dict, description="Ray Serve deployment options: num_replicas or autoscaling_config, "
        "max_ongoing_requests, max_queued_requests, ray_actor_options.",
    )

    accelerator_type: str | None = Field(
        None, description="Ray accelerator type of the replicas (e.g. A10G, L4, H100), as Ray Serve LLM's "
        "LLMConfig.accelerator_type: a scheduling constraint of GPU replicas. A CPU replica (no GPU reserved, the "
        "transformers engine) has no accelerator to match: the type is logged and not passed to Ray.")
    runtime_env: dict[str, Any] | None = Field(None, description="Ray runtime_env of the replicas (Ray Serve LLM's).")

    @model_validator(mode="before")
    @classmethod
    def _ray_names(cls, data: Any) -> Any:  # llm_engine, request_router_config, ... (fleetllm.serve.ray_names)
        from fleetllm.serve.ray_names import normalize

        return normalize(data)

    @model_validator(mode="after")
    def _accelerator_on_cpu(self) -> "LLMConfig":
        if self.accelerator_type and self.on_cpu():
            log.warning("LLMConfig accelerator_type=%r: the replicas of %r run on CPU (transformers, no GPU "
                        "reserved), so the type is not passed to Ray", self.accelerator_type, self.model_id)
        return self

    @field_validator("deployment_config")
    @classmethod
    def _known_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(value) - DEPLOYMENT_KEYS)
        if unknown:
            raise ValueError(f"deployment_config keys {unknown} are not supported; use {sorted(DEPLOYMENT_KEYS)}")
        if value.get("num_replicas") == "auto":
            raise ValueError("deployment_config num_replicas='auto' is not supported; give autoscaling_config "
                             "(min_replicas, max_replicas) for Ray Serve's autoscaling")
        if "autoscaling_config" in value and "num_replicas" in value:
            raise ValueError("give either num_replicas or autoscaling_config in deployment_config, not both")
        return value

    @property
    def model_id(self) -> str:
        return self.model_loading_config.model_id

    def resolved_engine(self) -> str:
        """The engine a replica runs: fleetllm.sizing.choose_engine (auto: vLLM when it is installed and there
        are GPUs: the replica's, or where it reserves none, this machine's), as for batch jobs."""
        gpus = self._reserved_gpus() or sizing.local_gpu_count()
        return sizing.choose_engine(self.engine, gpus=float(gpus))[0]

    def _reserved_gpus(self) -> float:
        return float(self.deployment_config.get("ray_actor_options", {}).get("num_gpus") or 0)

    def on_cpu(self) -> bool:
        """The replicas have no accelerator: no GPU reserved and an engine that then runs on the CPU (transformers,
        named or auto's)."""
        from fleetllm.engines.capabilities import capabilities, is_auto

        if self._reserved_gpus():
            return False
        return capabilities(self.resolved_engine() if is_auto(self.engine) else self.engine).cpu_unless_gpu_reserved

    def stream_budget(self, direct: bool = False) -> float:
        """Messages per second a replica may send across its streams (`stream_messages_per_s` or the default;
        `direct`: the replica is the HTTP ingress)."""
        if self.stream_messages_per_s is not None:
            return self.stream_messages_per_s
        gpus = self.deployment_options()["ray_actor_options"].get("num_gpus") or 0
        if gpus <= 0:
            return CPU_STREAM_MESSAGES_PER_S
        return GPU_DIRECT_STREAM_MESSAGES_PER_S if direct else GPU_STREAM_MESSAGES_PER_S

    def replica_options(self) -> dict[str, Any]:
        """The deployment config with fleetllm's defaults filled in, per replica as serve.yaml counts them."""
        return {"max_ongoing_requests": 32, "max_queued_requests": 64, **self.deployment_config}

    def deployment_options(self) -> dict[str, Any]:
        """Options for `Deployment.options(...)`, with fleetllm's defaults filled in."""
        opts = self.replica_options()
        replicas = opts.get("autoscaling_config", {}).get("max_replicas") or opts.get("num_replicas") or 1
        # max_queued_requests is per replica in serve.yaml; Ray Serve counts it per caller (the router)
        opts["max_queued_requests"] = int(opts["max_queued_requests"]) * int(replicas)
        opts.setdefault("ray_actor_options", {"num_cpus": 1})
        accelerator = self.accelerator_type if self.accelerator_type and not self.on_cpu() else None
        if accelerator or self.runtime_env:
            opts["ray_actor_options"] = {**opts["ray_actor_options"], **{k: v for k, v in (
                ("accelerator_type", accelerator), ("runtime_env", self.runtime_env)) if v}}
        return opts


def load_serve_spec(path: str | Path) -> ServeSpec:
    """Load and validate a serve.yaml file."""
    return parse_spec(ServeSpec, load_yaml(path), str(path))
