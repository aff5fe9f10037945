"""Data: Grain sources and transforms, teacher-corpus generation, the demo tokenizer and the
bundled live-commerce assets. Trains nothing.

Public API:
    Trajectories to training conversations (`data._convert`):
        Conversation, ConversionError, MODEL_ERRORS, trajectory_conversation,
        clean_retries, mark_retries, has_retries, split_rows
    Online Harness-State Augmentation of stored conversations (`data._rerender`):
        rerender, RerenderError, pin_constraints, loaded_skills
    Records to token rows (`data._examples`):
        RenderOptions, Prepared, prepare, bare_conversation, decode_record, read_conversations,
        TRUNCATION_POLICIES
    Corpus records and files (`data._records`):
        CORPUS_SCHEMA, corpus_record, state_info, CorpusWriter, write_json
    The teacher corpus (`data._corpus`; CLI `python -m launch.make_corpus`):
        CorpusConfig, TeacherConfig, STATE_MODES, CORPUS_SAMPLES, write_corpus, generate_corpus,
        corpus_scenario_ids, CorpusStats, CorpusOutcome
    Record sources: open_source, JsonlSource
    General instructions for OPD (`data._instructions`):
        Instruction, load_instructions, parse_instruction, check_constraints, pass_rates,
        prompt_hash, check_disjoint, read_prompt_records, CONSTRAINT_TYPES,
        DEMO_INSTRUCTIONS, CONFLICTS
    General instructions with answers, the base stage's corpus (`data._general`; CLI
    `python -m launch.make_general`):
        write_general_corpus, generate_general, respond_general, GENERAL_STATES,
        LOOKUP_SCHEMA (the source of its in-context lookup items, `data._lookup`)
    The Grain pipelines (`data.pipeline`):
        PipelineConfig, OnlineHSAConfig, sft_data, build_sft_dataset,
        make_augmenter, HsaAugmenter, opd_prompt_data, DataIterator, pad_id
    The keys of every batch (`hat_jax.batch`, shared with the trainer): BATCH_KEYS
    Data shards (`data._shards`; the global batch does not depend on the process count):
        resolve_shards, owned_shards, DEFAULT_SHARDS
    The demo tokenizer: `data.tokenizer.load_tokenizer` (module `data.tokenizer`).
"""

from data._convert import (
    MODEL_ERRORS,
    Conversation,
    ConversionError,
    clean_retries,
    has_retries,
    mark_retries,
    split_rows,
    trajectory_conversation,
)
from data._corpus import SAMPLES as CORPUS_SAMPLES
from data._corpus import STATE_MODES, CorpusConfig, CorpusStats, TeacherConfig, write_corpus
from data._corpus import Outcome as CorpusOutcome
from data._corpus import generate as generate_corpus
from data._corpus import scenario_ids as corpus_scenario_ids
from data._examples import (
    TRUNCATION_POLICIES,
    Prepared,
    RenderOptions,
    bare_conversation,
    decode_record,
    prepare,
    read_conversations,
)
from data._general import STATES as GENERAL_STATES
from data._general import generate as generate_general
from data._general import respond as respond_general
from data._general import write_general_corpus
from data._instructions import (
    CONFLICTS,
    CONSTRAINT_TYPES,
    DEMO_INSTRUCTIONS,
    Instruction,
    check_constraints,
    check_disjoint,
    load_instructions,
    parse_instruction,
    pass_rates,
    prompt_hash,
    read_prompt_records,
)
from data._iterator import DataIterator
from data._lookup import SCHEMA as LOOKUP_SCHEMA
from data._records import SCHEMA as CORPUS_SCHEMA
from data._records import CorpusWriter, corpus_record, state_info, write_json
from data._rerender import RerenderError, loaded_skills, pin_constraints, rerender
from data._shards import DEFAULT_SHARDS, owned_shards, resolve_shards
from data._sources import JsonlSource, open_source
from data.pipeline import (
    HsaAugmenter,
    OnlineHSAConfig,
    PipelineConfig,
    build_sft_dataset,
    make_augmenter,
    opd_prompt_data,
    pad_id,
    sft_data,
)
from hat_jax.batch import BATCH_KEYS

__all__ = [
    "HsaAugmenter",
    "corpus_scenario_ids",
    "generate_corpus",
    "CorpusOutcome",
    "write_corpus",
    "TeacherConfig",
    "CorpusStats",
    "CorpusConfig",
    "STATE_MODES",
    "CORPUS_SAMPLES",
    "BATCH_KEYS",
    "CONFLICTS",
    "CONSTRAINT_TYPES",
    "GENERAL_STATES",
    "LOOKUP_SCHEMA",
    "generate_general",
    "respond_general",
    "write_general_corpus",
    "CORPUS_SCHEMA",
    "DEMO_INSTRUCTIONS",
    "MODEL_ERRORS",
    "TRUNCATION_POLICIES",
    "Conversation",
    "ConversionError",
    "CorpusWriter",
    "DEFAULT_SHARDS",
    "DataIterator",
    "Instruction",
    "JsonlSource",
    "OnlineHSAConfig",
    "PipelineConfig",
    "Prepared",
    "RenderOptions",
    "RerenderError",
    "bare_conversation",
    "build_sft_dataset",
    "check_constraints",
    "check_disjoint",
    "clean_retries",
    "corpus_record",
    "decode_record",
    "read_conversations",
    "has_retries",
    "load_instructions",
    "pass_rates",
    "prompt_hash",
    "read_prompt_records",
    "loaded_skills",
    "make_augmenter",
    "mark_retries",
    "opd_prompt_data",
    "open_source",
    "owned_shards",
    "pad_id",
    "parse_instruction",
    "pin_constraints",
    "prepare",
    "rerender",
    "resolve_shards",
    "sft_data",
    "split_rows",
    "state_info",
    "trajectory_conversation",
    "write_json",
]
