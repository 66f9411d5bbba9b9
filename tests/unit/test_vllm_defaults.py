"""vLLM settings for offline batch, sized from the rows a replica holds (fleetllm.engines.vllm_defaults)."""

from fleetllm.engines.vllm_defaults import capture_sizes, offline_batch_defaults


def test_a_1024_row_job_on_an_h200_captures_graphs_for_the_whole_decode_batch():
    # vLLM's own default there: max_num_seqs 1024, graphs only up to 512 sequences
    assert offline_batch_defaults(1024, True, {}, 1024) == {"compilation_config": {"cudagraph_capture_sizes": capture_sizes(1024)}}
    # 2,000 rows in flight: as many as vLLM runs at once (its max_num_seqs), never more
    assert offline_batch_defaults(2000, True, {}, 1024) == {"compilation_config": {"cudagraph_capture_sizes": capture_sizes(1024)}}
    # 600 rows: as many sequences, the largest graph rounded up to vLLM's stride of 16 past 256
    assert offline_batch_defaults(600, True, {}, 1024) == {"max_num_seqs": 608,
                                                           "compilation_config": {"cudagraph_capture_sizes": capture_sizes(608)}}
    # 400 rows: vLLM's own graphs (to 512) already hold the decode batch
    assert offline_batch_defaults(400, True, {}, 1024) == {"max_num_seqs": 400}


def test_capture_sizes_are_vllms_up_to_256_then_every_64_and_end_at_the_top():
    sizes = capture_sizes(1024)
    assert sizes[:4] == [1, 2, 4, 8] and sizes[-1] == 1024 and sizes == sorted(set(sizes))
    assert [s for s in sizes if s <= 256] == [1, 2, 4] + list(range(8, 257, 8))  # vLLM's own below 256
    assert [s for s in sizes if s > 256] == list(range(320, 1025, 64))
    assert len(sizes) < 51  # fewer graphs than vLLM's default capture to 512
    assert capture_sizes(608)[-2:] == [576, 608]  # the full decode batch always has its graph


def test_a_small_job_asks_for_the_sequences_it_runs_and_vllm_picks_the_graphs():
    assert offline_batch_defaults(16, True, {}, 1024) == {"max_num_seqs": 16}
    assert offline_batch_defaults(13, False, {}, 256) == {"max_num_seqs": 16}
    assert offline_batch_defaults(400, True, {}, 256) == {}  # vLLM's defaults already fit (256 seqs, graphs to 512)


def test_what_the_user_set_is_left_alone():
    assert offline_batch_defaults(1024, True, {"max_num_seqs": 512}, 1024) == {}
    assert offline_batch_defaults(16, True, {"max_num_seqs": 8}, 1024) == {}
    assert offline_batch_defaults(1024, True, {"enforce_eager": True}, 1024) == {}
    assert offline_batch_defaults(1024, True, {"compilation_config": {"cudagraph_capture_sizes": [1, 8]}}, 1024) == {}
    assert offline_batch_defaults(1024, True, {"compilation_config": {"max_cudagraph_capture_size": 256}}, 1024) == {}
    # other compilation settings are kept and the capture size is added beside them
    assert offline_batch_defaults(1024, True, {"compilation_config": '{"mode": 3}'}, 1024) == {
        "compilation_config": {"mode": 3, "cudagraph_capture_sizes": capture_sizes(1024)}}
    assert offline_batch_defaults(1024, True, {"compilation_config": {"cudagraph_mode": "NONE"}}, 1024) == {}


def test_no_rows_in_flight_known_means_no_change_and_no_graphs_on_cpu():
    assert offline_batch_defaults(None, True, {}, 1024) == {}  # serving
    assert offline_batch_defaults(1024, False, {}, 256) == {}  # CPU: no CUDA graphs; 256 seqs already fit
