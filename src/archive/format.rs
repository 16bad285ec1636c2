//! The archive's file format: one Parquet file per folded range of one stream.
//!
//! Columns (DESIGN.md, "The archive"), in this order:
//!
//! | column | Arrow type | holds |
//! | --- | --- | --- |
//! | `stream` | utf8 | the stream key |
//! | `stream_id` | utf8 | `ms-seq`, the entry's id in that stream |
//! | `branded_id` | utf8 (28 hex), null only when there is none | [`entry::branded_id`] |
//! | `minted_at` | timestamp(ms, UTC), null with `branded_id` | the branded id's milliseconds |
//! | `fields` | list<struct<name: binary, value: binary>> | every Redis field, in stream order |
//!
//! `fields` keeps every field exactly as Redis stores it — the reserved
//! branded-id field and `traceparent` included, repeated names, names that are
//! not UTF-8, empty values — so a read-back is the [`RawEntry`] that was folded
//! and the live path's [`entry::to_entry`] serves both. `branded_id` and
//! `minted_at` are derived copies for people querying the files (DuckDB,
//! pandas, Spark); the read path does not use them. Compression is zstd
//! (level 3, DuckDB's default): about five times smaller than snappy on
//! entries like ours (TOOLCHAIN.md).

use std::sync::Arc;

use arrow_array::{
    Array, ArrayRef, BinaryArray, ListArray, RecordBatch, StringArray, StructArray, TimestampMillisecondArray,
};
use arrow_buffer::OffsetBuffer;
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use bytes::Bytes;
use parquet::{
    arrow::{arrow_reader::ParquetRecordBatchReaderBuilder, ArrowWriter, ProjectionMask},
    basic::{Compression, ZstdLevel},
    file::{metadata::KeyValue, properties::WriterProperties},
};

use super::ArchiveError;
use crate::{entry, id::StreamId, redis::RawEntry};

/// zstd level 3: DuckDB's default; level 1 saves little time on files this size.
const ZSTD_LEVEL: i32 = 3;

/// Rows decoded per Arrow batch on the read path: bounds the memory of one
/// decoding step independently of the file's size.
const READ_BATCH_ROWS: usize = 4096;

/// Rows per Parquet row group, the unit a Read decodes: a page of a Read
/// decodes at most about two row groups beyond what it returns, not the whole
/// file (25,000 entries by default).
const ROW_GROUP_ROWS: usize = 4096;

/// The footer key (Parquet key-value metadata) that holds each row group's
/// first stream id, comma-separated in row group order, so a Read decodes only
/// the row groups that overlap its range. A file without it is read whole.
const FIRST_IDS_KEY: &str = "echomq.row_group_first_ids";

/// The column names, as DuckDB users see them.
const STREAM: &str = "stream";
const STREAM_ID: &str = "stream_id";
const BRANDED_ID: &str = "branded_id";
const MINTED_AT: &str = "minted_at";
const FIELDS: &str = "fields";

/// The element type of `fields`: one Redis field.
fn pair_fields() -> Fields {
    Fields::from(vec![Field::new("name", DataType::Binary, false), Field::new("value", DataType::Binary, false)])
}

/// The files' Arrow schema.
fn schema() -> SchemaRef {
    let pair = Field::new_list_field(DataType::Struct(pair_fields()), false);
    Arc::new(Schema::new(vec![
        Field::new(STREAM, DataType::Utf8, false),
        Field::new(STREAM_ID, DataType::Utf8, false),
        Field::new(BRANDED_ID, DataType::Utf8, true),
        Field::new(MINTED_AT, DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())), true),
        Field::new(FIELDS, DataType::List(Arc::new(pair)), false),
    ]))
}

/// What [`encode`] made: the file's bytes and the range they hold.
#[derive(Debug)]
pub(super) struct Encoded {
    /// The Parquet file.
    pub(super) bytes: Bytes,
    /// The first and last entries' stream ids.
    pub(super) first_id: StreamId,
    pub(super) last_id: StreamId,
}

/// Encodes `entries` of `stream` as one Parquet file, in memory.
///
/// Errors: [`ArchiveError::Input`] when `entries` is empty, not strictly
/// ascending, holds an entry with no body (deleted while pending: there is
/// nothing to archive), or holds more than 2 GiB of field bytes (Arrow's
/// 32-bit offsets; fold fewer entries at a time); [`ArchiveError::Format`]
/// when the Parquet writer fails.
pub(super) fn encode(stream: &str, id_field: &str, entries: &[RawEntry]) -> Result<Encoded, ArchiveError> {
    let (Some(first), Some(last)) = (entries.first(), entries.last()) else {
        return Err(ArchiveError::Input(format!("no entries to archive for stream `{stream}`")));
    };
    if let Some(pair) = entries.windows(2).find(|pair| pair[0].id >= pair[1].id) {
        return Err(ArchiveError::Input(format!(
            "entries of stream `{stream}` are not in ascending id order: {} before {}",
            pair[0].id, pair[1].id
        )));
    }

    let rows = entries.len();
    let mut stream_ids = Vec::with_capacity(rows);
    let mut branded = Vec::with_capacity(rows);
    let mut minted = Vec::with_capacity(rows);
    let mut offsets = Vec::with_capacity(rows + 1);
    offsets.push(0i32);
    let (mut names, mut values) = (Vec::new(), Vec::new());
    let mut bytes = 0usize;
    for raw in entries {
        let Some(fields) = &raw.fields else {
            return Err(ArchiveError::Input(format!(
                "entry {} of stream `{stream}` has no body (it was deleted): there is nothing to archive",
                raw.id
            )));
        };
        let id = entry::branded_id(raw.id, fields, id_field);
        stream_ids.push(raw.id.to_string());
        branded.push(id.map(|id| id.to_string()));
        // Branded milliseconds fit in 6 bytes, so in an i64.
        minted.push(id.map(|id| id.minted_at_ms() as i64));
        for (name, value) in fields {
            bytes += name.len() + value.len();
            names.push(&name[..]);
            values.push(&value[..]);
        }
        let count = i32::try_from(names.len()).ok().filter(|_| bytes <= i32::MAX as usize).ok_or_else(|| {
            ArchiveError::Input(format!(
                "entries of stream `{stream}` from {} hold more than 2 GiB of fields: fold fewer at a time",
                first.id
            ))
        })?;
        offsets.push(count);
    }

    let pairs = StructArray::new(
        pair_fields(),
        vec![Arc::new(BinaryArray::from_vec(names)) as ArrayRef, Arc::new(BinaryArray::from_vec(values))],
        None,
    );
    let element = Arc::new(Field::new_list_field(DataType::Struct(pair_fields()), false));
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(std::iter::repeat_n(stream, rows))),
        Arc::new(StringArray::from(stream_ids)),
        Arc::new(StringArray::from(branded)),
        Arc::new(TimestampMillisecondArray::from(minted).with_timezone("UTC")),
        Arc::new(ListArray::new(element, OffsetBuffer::new(offsets.into()), Arc::new(pairs), None)),
    ];
    let failed =
        |e: &dyn std::fmt::Display| ArchiveError::Format(format!("encoding stream `{stream}` as Parquet: {e}"));
    let batch = RecordBatch::try_new(schema(), columns).map_err(|e| failed(&e))?;

    let level = ZstdLevel::try_new(ZSTD_LEVEL).map_err(|e| failed(&e))?;
    let properties = WriterProperties::builder()
        .set_compression(Compression::ZSTD(level))
        .set_created_by(concat!("echomq-sidecar ", env!("CARGO_PKG_VERSION")).to_owned())
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .build();
    let mut file = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut file, batch.schema(), Some(properties)).map_err(|e| failed(&e))?;
    writer.write(&batch).map_err(|e| failed(&e))?;
    writer.flush().map_err(|e| failed(&e))?;
    // The first id of each row group as the writer cut them.
    let mut first_ids = Vec::with_capacity(writer.flushed_row_groups().len());
    let mut row = 0;
    for group in writer.flushed_row_groups() {
        first_ids.push(entries[row].id.to_string());
        row += usize::try_from(group.num_rows()).unwrap_or(usize::MAX);
    }
    writer.append_key_value_metadata(KeyValue::new(FIRST_IDS_KEY.to_owned(), first_ids.join(",")));
    writer.close().map_err(|e| failed(&e))?;
    Ok(Encoded { bytes: file.into(), first_id: first.id, last_id: last.id })
}

/// What [`decode`] should return of a file: ids in `start..=end`, at most `limit`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Want {
    pub(super) start: StreamId,
    pub(super) end: StreamId,
    pub(super) limit: usize,
}

/// Decodes the entries of the Parquet file `bytes` (at `path`, for messages)
/// that `want` asks for, appending them to `out` in file order (ascending).
/// Returns the file's row count, from its footer, so the caller can check it
/// against the manifest. Only `stream_id` and `fields` are decoded, and only
/// of the row groups that overlap `want` (by the footer's first ids).
///
/// Errors: [`ArchiveError::Format`] for a file that is not Parquet or lacks
/// the columns, or whose types are not the archive's.
pub(super) fn decode(path: &str, bytes: Bytes, want: Want, out: &mut Vec<RawEntry>) -> Result<u64, ArchiveError> {
    let failed = |e: &dyn std::fmt::Display| ArchiveError::Format(format!("archive file `{path}`: {e}"));
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes).map_err(|e| failed(&e))?;
    let rows = u64::try_from(builder.metadata().file_metadata().num_rows()).unwrap_or(0);
    let index = |name: &str| builder.schema().index_of(name).map_err(|e| failed(&e));
    let mask = ProjectionMask::roots(builder.parquet_schema(), [index(STREAM_ID)?, index(FIELDS)?]);
    let groups = overlapping_row_groups(builder.metadata().file_metadata().key_value_metadata(), want)
        .filter(|groups| groups.iter().all(|&group| group < builder.metadata().num_row_groups()));
    let builder = match groups {
        Some(groups) => builder.with_row_groups(groups),
        None => builder,
    };
    let reader = builder.with_projection(mask).with_batch_size(READ_BATCH_ROWS).build().map_err(|e| failed(&e))?;

    fn column<'a, T: 'static>(array: Option<&'a ArrayRef>, name: &str) -> Result<&'a T, String> {
        array
            .and_then(|array| array.as_any().downcast_ref::<T>())
            .ok_or_else(|| format!("column `{name}` is missing or has the wrong type"))
    }
    for batch in reader {
        let batch = batch.map_err(|e| failed(&e))?;
        let ids = column::<StringArray>(batch.column_by_name(STREAM_ID), STREAM_ID).map_err(|e| failed(&e))?;
        let lists = column::<ListArray>(batch.column_by_name(FIELDS), FIELDS).map_err(|e| failed(&e))?;
        let pairs = lists
            .values()
            .as_any()
            .downcast_ref::<StructArray>()
            .ok_or_else(|| failed(&"`fields` is not a list of structs"))?;
        let names = column::<BinaryArray>(pairs.column_by_name("name"), "fields.name").map_err(|e| failed(&e))?;
        let values = column::<BinaryArray>(pairs.column_by_name("value"), "fields.value").map_err(|e| failed(&e))?;
        let offsets = lists.value_offsets();
        for row in 0..batch.num_rows() {
            let id: StreamId = ids.value(row).parse().map_err(|e| failed(&e))?;
            if id < want.start {
                continue;
            }
            if id > want.end || out.len() >= want.limit {
                return Ok(rows);
            }
            let span = offsets[row] as usize..offsets[row + 1] as usize;
            let fields = span
                .map(|k| (Bytes::copy_from_slice(names.value(k)), Bytes::copy_from_slice(values.value(k))))
                .collect();
            out.push(RawEntry { id, fields: Some(fields) });
        }
    }
    Ok(rows)
}

/// The row groups whose ids can fall in `want.start..=want.end`, by the first
/// ids under [`FIRST_IDS_KEY`]; `None` (read them all) when the footer has no
/// such list or one that does not parse.
fn overlapping_row_groups(metadata: Option<&Vec<KeyValue>>, want: Want) -> Option<Vec<usize>> {
    let listed = metadata?.iter().find(|kv| kv.key == FIRST_IDS_KEY)?.value.as_deref()?;
    let first_ids = listed.split(',').map(str::parse::<StreamId>).collect::<Result<Vec<_>, _>>().ok()?;
    let overlapping = (0..first_ids.len()).filter(|&group| {
        let starts_by_the_end = first_ids[group] <= want.end;
        let ends_after_the_start = first_ids.get(group + 1).is_none_or(|next| *next > want.start);
        starts_by_the_end && ends_after_the_start
    });
    Some(overlapping.collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(count: u64) -> Vec<RawEntry> {
        (0..count)
            .map(|seq| RawEntry {
                id: StreamId { ms: 7, seq },
                fields: Some(vec![(Bytes::from_static(b"n"), seq.to_string().into())]),
            })
            .collect()
    }

    fn ids(entries: &[RawEntry]) -> Vec<u64> {
        entries.iter().map(|e| e.id.seq).collect()
    }

    #[test]
    fn a_range_decodes_only_the_row_groups_it_overlaps() {
        let count = ROW_GROUP_ROWS as u64 * 2 + 10;
        let file = encode("s", "id", &entries(count)).unwrap();
        let metadata = ParquetRecordBatchReaderBuilder::try_new(file.bytes.clone()).unwrap().metadata().clone();
        assert_eq!(metadata.num_row_groups(), 3);
        let at = |seq| StreamId { ms: 7, seq };
        let groups = |start, end| {
            overlapping_row_groups(
                metadata.file_metadata().key_value_metadata(),
                Want { start: at(start), end: at(end), limit: usize::MAX },
            )
            .unwrap()
        };
        let last_of_first = ROW_GROUP_ROWS as u64 - 1;
        assert_eq!(groups(0, 0), [0]);
        assert_eq!(groups(last_of_first, last_of_first + 1), [0, 1]);
        assert_eq!(groups(last_of_first + 1, count), [1, 2]);
        assert_eq!(groups(count + 5, count + 9), [2]);

        for (start, end) in [(0, 3), (last_of_first - 2, last_of_first + 3), (count - 4, count + 100)] {
            let mut out = Vec::new();
            let want = Want { start: at(start), end: at(end), limit: usize::MAX };
            assert_eq!(decode("f", file.bytes.clone(), want, &mut out).unwrap(), count);
            assert_eq!(ids(&out), (start..=end.min(count - 1)).collect::<Vec<_>>(), "{start}..={end}");
        }
    }
}
