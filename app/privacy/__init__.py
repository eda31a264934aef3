"""Personal data at rest (docs/privacy.md, docs/contract.md section 17): the key ring that
settings load, and the codec the store applies to every column holding what Telegram sent or a
downstream answered."""
