//! What a Kafka producer sends, as Narad messages: the record batches
//! (format v2) of one partition of a Produce request, checked whole before
//! anything is written, so a batch is taken all or nothing.
//!
//! A record's key becomes the message key (it must be UTF-8) and its value
//! the message (a null value is an empty one). Records with headers are
//! refused (Narad's messages have none, and dropping them would lose what
//! the producer sent), and so are transactional and control records. An
//! idempotent producer's (producer id, epoch, partition, sequence) becomes
//! the message's idempotency key, so its retries are stored once, and a new
//! epoch (whose sequences start at 0 again) is never taken for a retry.

use bytes::Bytes;
use kafka_protocol::records::RecordBatchDecoder;
use kafka_protocol::ResponseError;

/// Bytes of a record batch v2 header, up to its record count.
const BATCH_HEADER_BYTES: usize = 61;
/// Where the format version (the magic byte) is in a batch.
const MAGIC_AT: usize = 16;
/// Where the attributes (compression in the low 3 bits) are.
const ATTRIBUTES_AT: usize = 21;
/// The only batch format taken.
const MAGIC_V2: u8 = 2;
/// Compression codes 0 (none) to 4 (zstd).
const COMPRESSION_MAX: i16 = 4;

/// One record as a message to produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducedRecord {
    pub key: Option<Vec<u8>>,
    pub value: Bytes,
    /// `kafka:{producer id}:{epoch}:{partition}:{sequence}` for an
    /// idempotent producer's record.
    pub idempotency_key: Option<Vec<u8>>,
    /// An idempotent producer's id and epoch.
    pub producer: Option<Producer>,
}

/// An idempotent producer as its records name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Producer {
    pub id: i64,
    pub epoch: i16,
}

/// Why a partition's records were refused (nothing of them is written).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordsError {
    /// A batch that fails its CRC, is cut short, or is not format v2.
    #[error("a corrupt record batch: {0}")]
    Corrupt(String),
    /// A compression code Kafka does not define.
    #[error("compression code {0} is not one Kafka defines")]
    UnsupportedCompression(i16),
    /// A record Narad does not take.
    #[error("{0}")]
    Invalid(String),
}

impl RecordsError {
    /// The partition's error code in the Produce answer.
    pub fn code(&self) -> i16 {
        match self {
            Self::Corrupt(_) => ResponseError::CorruptMessage.code(),
            Self::UnsupportedCompression(_) => ResponseError::UnsupportedCompressionType.code(),
            Self::Invalid(_) => ResponseError::InvalidRecord.code(),
        }
    }
}

/// The records of every batch in `data`, for `partition`.
pub fn records_of(partition: i32, mut data: Bytes) -> Result<Vec<ProducedRecord>, RecordsError> {
    let mut out = Vec::new();
    while !data.is_empty() {
        let Some(header) = data.get(..BATCH_HEADER_BYTES) else {
            return Err(RecordsError::Corrupt(format!(
                "{} bytes left, fewer than a batch header's {BATCH_HEADER_BYTES}",
                data.len()
            )));
        };
        let magic = header[MAGIC_AT];
        if magic != MAGIC_V2 {
            return Err(RecordsError::Corrupt(format!(
                "message format v{magic}: only record batches (v2) are taken"
            )));
        }
        let attributes = i16::from_be_bytes([header[ATTRIBUTES_AT], header[ATTRIBUTES_AT + 1]]);
        let compression = attributes & 0x7;
        if compression > COMPRESSION_MAX {
            return Err(RecordsError::UnsupportedCompression(compression));
        }
        let set = RecordBatchDecoder::decode(&mut data)
            .map_err(|e| RecordsError::Corrupt(e.to_string()))?;
        for record in set.records {
            if record.control || record.transactional {
                return Err(RecordsError::Invalid(
                    "transactional records are not taken: Narad has no transactions".to_string(),
                ));
            }
            if !record.headers.is_empty() {
                return Err(RecordsError::Invalid(
                    "records with headers are refused: a Narad message has none, and they would be lost"
                        .to_string(),
                ));
            }
            let key = match record.key {
                Some(key) if std::str::from_utf8(&key).is_err() => {
                    return Err(RecordsError::Invalid(
                        "a record key that is not UTF-8 (Narad's keys are text)".to_string(),
                    ));
                }
                key => key.map(|k| k.to_vec()),
            };
            let producer =
                (record.producer_id >= 0 && record.producer_epoch >= 0).then_some(Producer {
                    id: record.producer_id,
                    epoch: record.producer_epoch,
                });
            let idempotency_key = producer.filter(|_| record.sequence >= 0).map(|p| {
                format!("kafka:{}:{}:{partition}:{}", p.id, p.epoch, record.sequence).into_bytes()
            });
            out.push(ProducedRecord {
                key,
                value: record.value.unwrap_or_default(),
                idempotency_key,
                producer,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::indexmap::IndexMap;
    use kafka_protocol::protocol::StrBytes;
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    fn record(key: Option<&[u8]>, value: &str, producer_id: i64, sequence: i32) -> Record {
        in_epoch(key, value, producer_id, 0, sequence)
    }

    fn in_epoch(
        key: Option<&[u8]>,
        value: &str,
        producer_id: i64,
        epoch: i16,
        sequence: i32,
    ) -> Record {
        Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id,
            producer_epoch: if producer_id >= 0 { epoch } else { -1 },
            timestamp_type: TimestampType::Creation,
            offset: i64::from(sequence.max(0)),
            sequence,
            timestamp: 1,
            key: key.map(Bytes::copy_from_slice),
            value: Some(Bytes::copy_from_slice(value.as_bytes())),
            headers: IndexMap::new(),
        }
    }

    fn batch(records: &[Record], compression: Compression) -> Bytes {
        let mut out = BytesMut::new();
        let options = RecordEncodeOptions {
            version: 2,
            compression,
        };
        RecordBatchEncoder::encode(&mut out, records.iter(), &options).expect("encode");
        out.freeze()
    }

    #[test]
    fn records_become_messages_with_their_keys() {
        let data = batch(
            &[
                record(Some(b"k1"), "one", -1, -1),
                record(None, "two", -1, -1),
            ],
            Compression::None,
        );
        let records = records_of(3, data).expect("records");
        assert_eq!(
            records,
            vec![
                ProducedRecord {
                    key: Some(b"k1".to_vec()),
                    value: Bytes::from_static(b"one"),
                    idempotency_key: None,
                    producer: None,
                },
                ProducedRecord {
                    key: None,
                    value: Bytes::from_static(b"two"),
                    idempotency_key: None,
                    producer: None,
                },
            ]
        );
    }

    #[test]
    fn an_idempotent_producers_records_carry_producer_epoch_partition_and_sequence() {
        let data = batch(
            &[record(None, "a", 7, 10), record(None, "b", 7, 11)],
            Compression::None,
        );
        let read = records_of(2, data).expect("records");
        let keys: Vec<Vec<u8>> = read
            .iter()
            .filter_map(|r| r.idempotency_key.clone())
            .collect();
        assert_eq!(
            keys,
            vec![b"kafka:7:0:2:10".to_vec(), b"kafka:7:0:2:11".to_vec()]
        );
        assert_eq!(read[0].producer, Some(Producer { id: 7, epoch: 0 }));
        // The same sequence in the next epoch is another record.
        let bumped = records_of(
            2,
            batch(&[in_epoch(None, "c", 7, 1, 10)], Compression::None),
        )
        .expect("records");
        assert_eq!(
            bumped[0].idempotency_key.as_deref(),
            Some(&b"kafka:7:1:2:10"[..])
        );
        assert_eq!(bumped[0].producer, Some(Producer { id: 7, epoch: 1 }));
    }

    #[test]
    fn a_batch_that_fails_its_crc_or_is_cut_short_is_corrupt() {
        let data = batch(&[record(None, "hello", -1, -1)], Compression::None);
        let mut bad = data.to_vec();
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        let error = records_of(0, Bytes::from(bad)).expect_err("crc");
        assert_eq!(error.code(), ResponseError::CorruptMessage.code());
        let cut = data.slice(..data.len() - 3);
        assert!(matches!(records_of(0, cut), Err(RecordsError::Corrupt(_))));
        let mut old = data.to_vec();
        old[MAGIC_AT] = 1;
        assert!(matches!(
            records_of(0, Bytes::from(old)),
            Err(RecordsError::Corrupt(_))
        ));
    }

    #[test]
    fn an_unknown_compression_code_is_refused_as_such() {
        let mut data = batch(&[record(None, "x", -1, -1)], Compression::None).to_vec();
        data[ATTRIBUTES_AT + 1] |= 0x6;
        let error = records_of(0, Bytes::from(data)).expect_err("codec");
        assert_eq!(error, RecordsError::UnsupportedCompression(6));
        assert_eq!(
            error.code(),
            ResponseError::UnsupportedCompressionType.code()
        );
    }

    #[test]
    fn headers_and_keys_that_are_not_text_are_invalid_records() {
        let mut with_header = record(None, "x", -1, -1);
        with_header.headers.insert(
            StrBytes::from_static_str("trace"),
            Some(Bytes::from_static(b"1")),
        );
        let error = records_of(0, batch(&[with_header], Compression::None)).expect_err("headers");
        assert_eq!(error.code(), ResponseError::InvalidRecord.code());
        let binary = record(Some(&[0xff, 0xfe]), "x", -1, -1);
        let error = records_of(0, batch(&[binary], Compression::None)).expect_err("key");
        assert_eq!(error.code(), ResponseError::InvalidRecord.code());
    }

    #[test]
    fn batches_in_every_codec_are_read() {
        for compression in [
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let records: Vec<Record> = (0..50)
                .map(|i| record(None, &format!("value {i} {}", "x".repeat(100)), 9, i))
                .collect();
            let read = records_of(1, batch(&records, compression)).expect("records");
            assert_eq!(read.len(), 50, "{compression:?}");
            assert_eq!(&read[49].value[..8], b"value 49", "{compression:?}");
        }
    }

    /// Valid batches with bytes changed, cut short or grown never panic.
    #[test]
    fn fuzzed_batches_never_panic() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        let valid = batch(
            &[record(Some(b"k"), "value", 3, 0), record(None, "v2", 3, 1)],
            Compression::None,
        );
        for _ in 0..20_000 {
            let mut bytes = valid.to_vec();
            for _ in 0..(next() % 4) {
                match next() % 3 {
                    0 => {
                        let at = (next() % bytes.len() as u64) as usize;
                        bytes[at] = next() as u8;
                    }
                    1 => bytes.truncate((next() % (bytes.len() as u64 + 1)) as usize),
                    _ => bytes.push(next() as u8),
                }
                if bytes.is_empty() {
                    break;
                }
            }
            let _ = records_of(0, Bytes::from(bytes));
        }
    }
}
